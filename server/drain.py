"""Graceful drain on SIGTERM: /ready turns 503 at once, new work is refused, work in flight runs on until it
ends or the drain deadline passes; what is still running then is cut with a word (an SSE error event, a
WebSocket `audio.done` with `cancelled` and a reason), and only then does the server stop.

Work registers with `track()` (an HTTP request for its whole response, a WebSocket session while open);
streams race each chunk against `cut` (see `until_cut`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

log = logging.getLogger("pcgtts.server")

SHUTDOWN_REASON = "server_shutdown"


class ServerShuttingDown(Exception):
    """The drain deadline passed while this stream was running."""


class StreamCut(Exception):
    """A raw audio response cut on purpose (the drain deadline passed): raised out of the app so that the
    server closes the connection without the body's last chunk, and the client sees an unfinished
    transfer, never a silently short file. Expected, so the route logs it as one INFO line and the
    server's "Exception in ASGI application" record of it is dropped (`quiet_expected_cuts`)."""


class _DropExpectedCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, StreamCut)


def quiet_expected_cuts() -> None:
    """uvicorn logs every exception out of the app as ERROR with a traceback; a StreamCut is no error."""
    server_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropExpectedCuts) for f in server_log.filters):
        server_log.addFilter(_DropExpectedCuts())


class Drain:
    def __init__(self, deadline_s: float):
        self.deadline_s = deadline_s
        self.draining = False
        self.active = 0
        self.cut = asyncio.Event()  # set at the deadline: streams still running end now
        self._idle = asyncio.Event()
        self._idle.set()
        self._on_start: list[Callable[[], None]] = []

    @contextlib.contextmanager
    def track(self):
        self.active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.active -= 1
            if self.active == 0:
                self._idle.set()

    def on_start(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when the drain starts (at once if it has); returns a function that unregisters."""
        if self.draining:
            callback()
        else:
            self._on_start.append(callback)
        return lambda: self._on_start.remove(callback) if callback in self._on_start else None

    async def run(self) -> dict:
        """Drain: returns what happened (seconds taken, whether streams had to be cut)."""
        started = time.monotonic()
        self.draining = True
        log.info("draining: %d requests/sessions in flight, deadline %.0f s", self.active, self.deadline_s)
        for callback in list(self._on_start):
            callback()
        cut = False
        try:
            await asyncio.wait_for(self._idle.wait(), self.deadline_s)
        except TimeoutError:
            cut = True
            log.warning("drain deadline passed: cutting %d streams", self.active)
            self.cut.set()
            with contextlib.suppress(TimeoutError):  # cut streams end within a step; don't hang on one
                await asyncio.wait_for(self._idle.wait(), 10.0)
        took = time.monotonic() - started
        log.info("drained in %.1f s%s", took, " (streams cut at the deadline)" if cut else "")
        return {"seconds": took, "cut": cut, "left": self.active}


async def until_cut(chunks: AsyncIterator, drain: Drain | None) -> AsyncIterator:
    """`chunks`, unless the drain deadline passes first: then the pending step is cancelled (its generator
    unwinds, aborting the engine request) and ServerShuttingDown is raised."""
    if drain is None:
        async for chunk in chunks:
            yield chunk
        return
    cut = asyncio.ensure_future(drain.cut.wait())
    step: asyncio.Future | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(chunks))
            done, _ = await asyncio.wait({step, cut}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                raise ServerShuttingDown("the server is shutting down and its drain deadline passed")
            try:
                chunk = step.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        cut.cancel()
        if step is not None and not step.done():  # cut, or our caller was cancelled: unwind the step now,
            step.cancel()  # so that whoever closes `chunks` next does not find it still running
            await asyncio.wait({step})
