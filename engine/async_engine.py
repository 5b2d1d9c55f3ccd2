"""Asyncio front of the engine: the step loop runs in its own thread; requests stream token deltas.

    engine = AsyncEngine(EngineConfig(...))
    async for delta in engine.stream(prompt_ids, SamplingParams(...)):
        ...  # delta.token_ids: tokens accepted since the previous delta

The event loop never runs model code: `stream` hands requests to the engine thread through a locked
command queue, and the thread posts deltas back with `call_soon_threadsafe`. Closing or cancelling the
iterator (the client went away) aborts the request, which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pcgtts.engine.acceptance import RULES
from pcgtts.engine.config import EngineConfig, SamplingParams
from pcgtts.engine.errors import EngineFault, EngineOverloaded, EngineShutdown, RequestFailed
from pcgtts.engine.llm_engine import Engine, RequestOutput
from pcgtts.engine.metrics import EngineMetrics
from pcgtts.engine.torch_threads import adopt_torch_threads, name_native_thread

log = logging.getLogger(__name__)


@dataclass
class TokenDelta:
    token_ids: list[int]  # tokens accepted since the previous delta
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None (an "error" raises RequestFailed)
    num_drafted: int  # draft tokens proposed for this request since the previous delta
    num_accepted: int  # of which accepted


class _Stream:
    """Where the engine thread posts one request's deltas (an asyncio queue on the caller's loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def post(self, item: TokenDelta | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            pass


class AsyncEngine:
    """The built-in engine behind the streaming interface (engine/streaming.py)."""

    name = "builtin"
    acceptance_rules = tuple(RULES)  # every rule, per request
    per_request_gamma = True  # a row verifies up to its own num_speculative_tokens

    def __init__(self, config: EngineConfig, engine: Engine | None = None):
        self.config = config
        self.engine = engine or Engine(config)
        self._lock = threading.Lock()  # guards _commands, _pending_adds, _closed
        self._commands: deque[tuple] = deque()
        self._pending_adds = 0
        self._closed = False
        self.fault: str | None = None  # set when a fault that is nobody's failed every request (see faults)
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}  # engine thread only
        self._metrics = self.engine.metrics()
        self._thread = threading.Thread(target=self._run, name="pcgtts-engine", daemon=True)
        self._thread.start()

    @property
    def target_config(self):
        return self.engine.target_config

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def num_speculative_tokens(self) -> int:
        return self.engine.num_speculative_tokens

    # ---- caller side (event loop) -------------------------------------------------------------------------
    async def stream(self, prompt_ids: list[int], params: SamplingParams,
                     request_id: str | None = None, continuing: bool = False) -> AsyncIterator[TokenDelta]:
        """Token deltas of one request as they are accepted; the last has finished=True.

        continuing: this is the next part of a request admitted earlier (a later sentence of one input):
        it is never refused for a full queue. Admission is decided once per client request.

        Raises EngineOverloaded (queue full), RequestTooLong / ValueError (bad request), EngineShutdown or
        EngineFault before yielding anything; RequestFailed (this request failed in a step, the others
        went on) or EngineFault later."""
        prompt_ids = self.engine.validate(prompt_ids, params)
        request_id = request_id or uuid.uuid4().hex
        stream = _Stream(asyncio.get_running_loop())
        with self._lock:
            if self._closed:
                raise EngineShutdown("the engine is shut down")
            if self.fault is not None:
                raise EngineFault(f"the engine failed and takes no new requests: {self.fault}")
            if not continuing and \
                    len(self.engine.scheduler.waiting) + self._pending_adds >= self.config.max_waiting:
                raise EngineOverloaded(f"waiting queue full ({self.config.max_waiting} requests)")
            self._pending_adds += 1
            self._commands.append(("add", request_id, prompt_ids, params, stream, continuing))
        self._wake.set()
        done = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.finished
                yield item
                if done:
                    return
        finally:
            if not done:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread; its stream (if still open) ends with finish_reason "abort"."""
        with self._lock:
            self._commands.append(("abort", request_id))
        self._wake.set()

    def set_deadline(self, request_id: str, deadline: float | None) -> None:
        """From any thread: when this request's listener runs out of audio (time.perf_counter() time), for
        the scheduler's audio-deadline ordering (Engine.set_deadline)."""
        with self._lock:
            self._commands.append(("deadline", request_id, deadline))

    def pin_prefix(self, token_ids: list[int], lru: bool = False) -> None:
        """From any thread: keep this prompt prefix cached (Engine.pin_prefix)."""
        with self._lock:
            self._commands.append(("pin", token_ids, lru))
        self._wake.set()

    def metrics(self) -> EngineMetrics:
        """The snapshot published after the engine thread's latest step."""
        return self._metrics

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
        self._wake.set()
        self._thread.join()

    close = shutdown

    # ---- engine thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        adopt_torch_threads()
        name_native_thread()
        engine = self.engine
        while True:
            self._wake.clear()
            with self._lock:
                commands = list(self._commands)
                self._commands.clear()
                closed = self._closed
            for command in commands:
                self._apply(command)
            if closed:
                self._close_all()
                return
            if engine.has_unfinished():
                try:
                    outputs = engine.step()
                except Exception as exc:  # nobody's fault (one request's is isolated inside step()): fail
                    # everyone in flight rather than hang them, refuse new work, and let /ready say so
                    log.exception("engine step failed for every request")
                    with self._lock:
                        self.fault = f"{type(exc).__name__}: {exc}"
                    self._fail_all(exc if isinstance(exc, EngineFault) else EngineFault(self.fault))
                    outputs = []
                self._metrics = engine.metrics()  # before delivery: a client never sees older counters
                for out in outputs:
                    self._deliver(out)
            else:
                self._metrics = engine.metrics()
                self._wake.wait()

    def _apply(self, command: tuple) -> None:
        if command[0] == "add":
            _, request_id, prompt_ids, params, stream, continuing = command
            try:
                if self.fault is not None:  # queued before the fault: refused like later ones
                    raise EngineFault(f"the engine failed and takes no new requests: {self.fault}")
                self.engine.add_request(prompt_ids, params, request_id, continuing)
                self._streams[request_id] = stream
            except Exception as exc:  # noqa: BLE001 (handed to the caller)
                stream.post(exc)
            finally:
                with self._lock:
                    self._pending_adds -= 1
        elif command[0] == "deadline":
            self.engine.set_deadline(command[1], command[2])
        elif command[0] == "pin":
            self.engine.pin_prefix(command[1], command[2])
        else:
            request_id = command[1]
            if self.engine.abort(request_id):
                stream = self._streams.pop(request_id, None)
                if stream is not None:
                    stream.post(TokenDelta([], True, "abort", 0, 0))

    def _deliver(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return
        if out.finished:
            del self._streams[out.request_id]
        if out.finish_reason == "error":
            stream.post(RequestFailed(out.error or "the request failed in the engine"))
            return
        stream.post(TokenDelta(out.token_ids, out.finished, out.finish_reason, out.num_drafted,
                               out.num_accepted))

    def _fail_all(self, exc: BaseException) -> None:
        for request_id, stream in list(self._streams.items()):
            self.engine.abort(request_id)
            stream.post(exc)
        self._streams.clear()
        for seq in list(self.engine.scheduler.waiting):
            self.engine.abort(seq.request_id)

    def _close_all(self) -> None:
        self._fail_all(EngineShutdown("the engine was shut down"))
