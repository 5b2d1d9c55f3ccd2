"""Running one synthesis for one client: error mapping, the wait for the first chunk, per-request timing,
and a streaming response that aborts generation the moment the client goes away.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import numpy as np
from pcgtts.server.audio.pipeline import OutputPipeline
from pcgtts.server.drain import SHUTDOWN_REASON, ServerShuttingDown, StreamCut
from pcgtts.server.errors import APIError, bad_request
from pcgtts.server.metrics import RequestOutcome, ServerMetrics, UnderrunTracker
from pcgtts.server.schemas import SamplingFields
from pcgtts.tts import (
    InputTooLong,
    InvalidOptions,
    NothingToSay,
    ReferenceClip,
    ServiceOverloaded,
    ServiceUnavailable,
    Synthesis,
    SynthesisFailed,
    SynthesisOptions,
    TTSService,
    VoicePrompt,
    WordTiming,
)
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class ClientGone(Exception):
    """The client disconnected before the response started."""


def synthesis_options(fields: SamplingFields, *, streaming: bool = True,
                      word_timings: bool = False) -> SynthesisOptions:
    return SynthesisOptions(
        temperature=fields.temperature, top_k=fields.top_k, top_p=fields.top_p,
        repetition_penalty=fields.repetition_penalty, max_tokens=fields.max_tokens, seed=fields.seed,
        acceptance=fields.acceptance, num_speculative_tokens=fields.num_speculative_tokens,
        asg_table=fields.asg_table, streaming=streaming, word_timings=word_timings)


class WordClock:
    """A synthesis's word timings in samples of the audio sent (the pipeline's output), each word handed
    out once the audio sent has reached its start, so a timing never runs ahead of its sound."""

    def __init__(self, synth: Synthesis, pipeline: OutputPipeline):
        self._synth, self._pipeline = synth, pipeline
        self._known: deque[WordTiming] = deque()

    def due(self, final: bool = False) -> list[dict]:
        """`{"text", "start", "end"}` of the words now due (final: all that are left)."""
        self._known.extend(self._synth.take_words())
        position, sent = self._pipeline.position, self._pipeline.samples_out
        due = []
        while self._known and (final or position(self._known[0].start) < sent):
            word = self._known.popleft()
            due.append({"text": word.text, "start": position(word.start), "end": position(word.end)})
        return due


def service_error(exc: Exception) -> APIError:
    """Errors of the TTS service -> the OpenAI-shaped error a client gets."""
    if isinstance(exc, InvalidOptions):
        return bad_request(str(exc), param=exc.param)
    if isinstance(exc, ServiceOverloaded):
        return APIError(429, "The server is at capacity; retry shortly.", code="rate_limit_exceeded",
                        headers={"Retry-After": "1"})
    if isinstance(exc, InputTooLong):
        return bad_request(f"A sentence of the input is too long for the model: {exc}", param="input",
                           code="input_too_long")
    if isinstance(exc, ServiceUnavailable):
        return APIError(503, f"The engine is unavailable: {exc}", code="engine_unavailable",
                        headers={"Retry-After": "1"})
    if isinstance(exc, SynthesisFailed):
        return APIError(500, f"Synthesis of this request failed: {exc}", code="synthesis_failed")
    if isinstance(exc, NothingToSay):
        return APIError(422, f"Cannot synthesise this input: {exc}", param="input",
                        code="unprocessable_input")
    raise exc


def open_synthesis(service: TTSService, text: str, voice: VoicePrompt | ReferenceClip | None,
                   options: SynthesisOptions) -> Synthesis:
    try:
        return service.synthesize(text, voice, options)
    except (InvalidOptions, NothingToSay) as exc:
        raise service_error(exc) from exc


async def close_quietly(synth: Synthesis) -> None:
    """Abort/finish the synthesis even while the surrounding task is being cancelled."""
    with anyio.CancelScope(shield=True):
        await synth.aclose()


async def _disconnected(receive: Callable[[], Awaitable[dict]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def next_or_gone(synth: Synthesis, request: Request | None,
                       cut: asyncio.Event | None = None) -> np.ndarray | None:
    """The next chunk (None at the end), unless the client disconnects first (ClientGone) or the drain
    deadline passes (`cut` set: an APIError 503 `server_shutdown`, the response has not started).

    Service errors become APIError; the synthesis is closed on any failure.
    """
    step = asyncio.ensure_future(_next(synth))
    watch = asyncio.ensure_future(_disconnected(request.receive)) if request is not None else None
    deadline = asyncio.ensure_future(cut.wait()) if cut is not None else None
    try:
        waiting = {f for f in (step, watch, deadline) if f is not None}
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if step not in done:
            step.cancel()
            await asyncio.wait({step})  # let the generator unwind before it is closed below
            if deadline is not None and deadline in done:
                raise stream_error(ServerShuttingDown("the server is shutting down and its drain deadline "
                                                      "passed"))
            raise ClientGone()
        return step.result()
    except (ServiceOverloaded, InputTooLong, ServiceUnavailable, InvalidOptions, NothingToSay,
            SynthesisFailed) as exc:
        await close_quietly(synth)
        raise service_error(exc) from exc
    except BaseException:
        await close_quietly(synth)
        raise
    finally:
        for future in (watch, deadline):
            if future is not None:
                future.cancel()


async def _next(synth: Synthesis) -> np.ndarray | None:
    try:
        return await synth.__anext__()
    except StopAsyncIteration:
        return None


class SpeechRun:
    """Timing of one request (received -> first audio -> done) and its report to the metrics."""

    def __init__(self, metrics: ServerMetrics, fmt: str, stream_mode: str, started: float | None = None):
        self.metrics = metrics
        self.started = started if started is not None else time.perf_counter()
        self.outcome = RequestOutcome(format=fmt, stream_mode=stream_mode, status="aborted")
        self.underrun = UnderrunTracker()
        self._active = False  # counted in the audio_streams_active gauge

    def sent_audio(self, seconds: float) -> None:
        now = time.perf_counter()
        if self.outcome.ttfa_s is None:
            self.outcome.ttfa_s = now - self.started
            self._active = True
            self.metrics.streams_active.labels(self.metrics.model_name).inc()
        if seconds > 0:
            headroom = self.underrun.chunk(now, seconds)
            if headroom is not None:
                self.metrics.headroom.labels(self.metrics.model_name).observe(max(0.0, headroom))

    def finish(self, synth: Synthesis | None, status: str, audio_s: float) -> None:
        o = self.outcome
        if self._active:
            self._active = False
            self.metrics.streams_active.labels(self.metrics.model_name).dec()
        o.status = status
        o.e2e_s = time.perf_counter() - self.started
        o.audio_s = audio_s
        if synth is not None:
            st = synth.stats
            o.finished_reason = st.finish_reason if status == "ok" else "abort"
            if st.first_token_s is not None:
                o.first_token_s = (st.started_at - self.started) + st.first_token_s
            if st.first_audio_s is not None:
                o.first_audio_held_s = st.first_audio_held_s
        if status == "ok" and self.underrun.t0 is not None:
            o.underrun_s = self.underrun.worst
        self.metrics.record(o)


def usage_of(synth: Synthesis) -> dict[str, int]:
    st = synth.stats
    return {"input_tokens": st.prompt_tokens, "output_tokens": st.generated_tokens,
            "total_tokens": st.prompt_tokens + st.generated_tokens}


def outcome_status(err: APIError) -> str:
    """The `status` a request that ended with `err` is counted under in /metrics: an overload refusal (429)
    is `refused`, apart from the errors, so an operator tells a full server from a failing one."""
    return "refused" if err.status == 429 else "error"


def stream_error(exc: BaseException) -> APIError:
    """The in-band error for a stream that failed after its headers were sent."""
    if isinstance(exc, ServerShuttingDown):
        return APIError(503, str(exc), code=SHUTDOWN_REASON)
    try:
        return service_error(exc)
    except Exception:
        return APIError(500, f"synthesis failed: {type(exc).__name__}", code="internal_error")


def sse_event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class AbortingStreamingResponse(StreamingResponse):
    """Streams the body while watching for the client's disconnect; on disconnect the body iterator is
    cancelled at once (its `finally` aborts the engine request), whatever ASGI spec version the server
    speaks."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the socket closed under us
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await _disconnected(receive)
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            if group.split(StreamCut)[1] is None:  # a cut on purpose, nothing else: the bare StreamCut
                raise StreamCut() from None
            raise
        finally:
            # However the stream ended, run the body's cleanup now (it aborts the synthesis).
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


async def chunks_after(first: np.ndarray | None, synth: Synthesis) -> AsyncIterator[np.ndarray]:
    """The first chunk (already awaited), then the rest of the synthesis."""
    if first is None:
        return
    yield first
    async for chunk in synth:
        yield chunk
