"""`pcgtts serve`: run the HTTP server (every flag also reads a PCGTTS_* environment variable)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import threading

from pcgtts.server.settings import add_arguments, settings_from

log = logging.getLogger("pcgtts.server")


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
                            timeout_graceful_shutdown=5, ws=websocket_protocol())
    ready = ReadyLine(settings.host)
    app.state.pcgtts.when_loaded(ready.model_loaded)
    draining_server(config, app.state.pcgtts.drain, on_listening=ready.listening).run()
    return 0


def websocket_protocol():
    """uvicorn's default WebSocket protocol (websockets' sans-I/O one), less a defect: after the app refuses
    a handshake with an HTTP response (our 401, 403, 503), it never marks the handshake done, so every
    refusal also logged "ERROR: ASGI callable returned without completing handshake" (Kludex/uvicorn#3138;
    its wsproto protocol marks it). Marked here once the refusal's last byte is written."""
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    class RefusalCompletesHandshake(WebSocketsSansIOProtocol):
        async def send(self, message) -> None:
            await super().send(message)
            if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
                self.handshake_complete = True

    return RefusalCompletesHandshake


def browser_url(host: str, port: int) -> str:
    """The URL to open for a server bound to host:port (a wildcard address means this machine)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


class ReadyLine:
    """Logs one line once the model is loaded and the socket listens, in whichever order those happen:
    from then on /ready answers 200 and the page speaks (uvicorn's "running on" line comes while the model
    may still be loading, when a request would get 503)."""

    def __init__(self, host: str):
        self._host = host
        self._port: int | None = None
        self._loaded = False
        self._said = False
        self._lock = threading.Lock()

    def listening(self, port: int) -> None:
        with self._lock:
            self._port = port
        self._say_once_ready()

    def model_loaded(self) -> None:
        with self._lock:
            self._loaded = True
        self._say_once_ready()

    def _say_once_ready(self) -> None:
        with self._lock:
            if self._said or not self._loaded or self._port is None:
                return
            self._said = True
            url = browser_url(self._host, self._port)
        everywhere = " (listening on every interface)" if self._host in ("0.0.0.0", "::", "") else ""
        log.info("ready: open %s for the playground, %sdocs for the API%s", url, url, everywhere)


def draining_server(config, drain, on_listening=None):
    """uvicorn's server, but SIGTERM drains first (server.drain) and then exits 0; a second SIGTERM or a
    SIGINT (Ctrl-C) stops at once, as uvicorn does. on_listening(port): called once the socket listens."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started and on_listening is not None and self.servers and self.servers[0].sockets:
                on_listening(self.servers[0].sockets[0].getsockname()[1])

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
