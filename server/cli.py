"""`pcgtts serve`: run the HTTP server (every flag also reads a PCGTTS_* environment variable)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from pcgtts.server.settings import add_arguments, settings_from


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve the OpenAI-compatible speech API (default: the embedded model on :8000)",
        description="Serve /v1/audio/speech, voices, the WebSocket stream, /metrics and the playground. "
                    "Flags override PCGTTS_* environment variables, which override the defaults.")
    add_arguments(parser)
    parser.set_defaults(func=serve)


def set_torch_threads(settings) -> None:
    if settings.effective_torch_threads:
        import torch

        # The engine and codec threads each run small torch ops; one intra-op thread apiece keeps them from
        # oversubscribing a small CPU.
        torch.set_num_threads(settings.effective_torch_threads)


def serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pcgtts.server.app import create_app

    settings = settings_from(args)
    set_torch_threads(settings)
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            timeout_graceful_shutdown=5)
    draining_server(config, app.state.pcgtts.drain).run()
    return 0


def draining_server(config, drain):
    """uvicorn's server, but SIGTERM drains first (server.drain) and then exits 0; a second SIGTERM or a
    SIGINT (Ctrl-C) stops at once, as uvicorn does."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            if sig == signal.SIGTERM and not drain.draining and not self.should_exit:
                asyncio.get_event_loop().call_soon_threadsafe(self._start_drain)
                return  # not recorded: uvicorn would re-raise it at exit (status 143)
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

        def _start_drain(self) -> None:
            async def drain_then_exit() -> None:
                try:
                    await drain.run()
                finally:
                    self.should_exit = True

            self._drain_task = asyncio.ensure_future(drain_then_exit())

    return DrainingServer(config)
