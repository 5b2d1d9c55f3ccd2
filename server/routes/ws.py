"""WebSocket /v1/audio/speech/stream: live playback, several utterances per connection (PROTOCOL)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Literal

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from pcgtts.server.audio.formats import OUTPUT_SAMPLE_RATE
from pcgtts.server.audio.pipeline import OutputPipeline
from pcgtts.server.drain import SHUTDOWN_REASON, ServerShuttingDown, until_cut
from pcgtts.server.errors import APIError, validation_error
from pcgtts.server.schemas import MAX_INPUT_CHARS, SamplingFields, VoiceId, integral
from pcgtts.server.security import chosen_subprotocol, origin_allowed, websocket_authorized
from pcgtts.server.state import AppState, get_ws_state
from pcgtts.server.streaming import (
    SpeechRun,
    WordClock,
    close_quietly,
    open_synthesis,
    outcome_status,
    service_error,
    stream_error,
    synthesis_options,
    usage_of,
)
from pcgtts.server.ws_protocol import (
    EMPTY_INPUT_DONE,
    MAX_QUEUED,
    AudioAlignment,
    AudioDone,
    AudioProgress,
    AudioStart,
    ChunkAcceptance,
    ErrorEvent,
    Message,
    SessionCreated,
    SessionDone,
    Usage,
    event_json,
    protocol_markdown,
)
from pcgtts.tts import NothingToSay, TextFeed
from pydantic import ConfigDict, Field, ValidationError, field_validator
from starlette.websockets import WebSocketDisconnect

router = APIRouter()
log = logging.getLogger("pcgtts.server")

HANDSHAKE = """\
API key, if set, at the handshake (a bad one gets HTTP 401): the header
`Authorization: Bearer KEY`, or from a browser the subprotocols `["pcgtts", "pcgtts.bearer.<base64url(KEY)>"]`
(the server selects `pcgtts`); `?api_key=KEY` still works but puts the key in URLs. Browsers may connect
from the server's own origin or one listed in `--cors-origins` (others get HTTP 403)."""
_DRAIN = object()  # queue marker: the server is draining; close after what is queued


class SessionConfig(SamplingFields):
    """Applies to utterances started after it (an utterance starts at its input.done, or in sentence mode at
    its first input.text): the speech request's fields, with `sample_rate` (8000-48000, default 24000) for
    the binary frames, and how text is flushed."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["session.config"] = "session.config"
    model: str | None = None
    voice: str | VoiceId | None = None
    response_format: Literal["pcm"] = "pcm"
    speed: float = Field(1.0, ge=0.25, le=4.0, strict=True)
    sample_rate: int = Field(OUTPUT_SAMPLE_RATE, ge=8000, le=48000, strict=True)
    _whole_numbers = field_validator("sample_rate", "flush_max_chars", "flush_max_ms",
                                     mode="before")(integral)
    instructions: str | None = None
    flush: Literal["manual", "sentence"] = Field(
        "manual", description='"manual": input.done speaks the pending text; "sentence": each sentence is '
                              "spoken as soon as it is complete (the next word has begun), while the text "
                              "still arrives, all of them one utterance (one audio.start ... audio.done, "
                              "the audio continuing across sentences); input.done speaks the rest. "
                              "Sentences end where the HTTP route's splitter ends them (not at "
                              'abbreviations, initials or decimal points)')
    flush_max_chars: int | None = Field(
        200, ge=1, le=MAX_INPUT_CHARS, strict=True,
        description="sentence mode: pending text longer than this is spoken without waiting for its "
                    "sentence's end, up to its last comma or complete word; null: no bound")
    flush_max_ms: int | None = Field(
        None, ge=1, le=60_000, strict=True,
        description="sentence mode: text pending this long (from its oldest character) is spoken the same "
                    "way; null (default): no bound")
    word_timings: bool = Field(False, strict=True,
                               description="true: audio.alignment events say when each word is heard")


PROTOCOL = protocol_markdown(SessionConfig, HANDSHAKE)  # /docs shows it; the README holds the same text


class Session:
    def __init__(self, ws: WebSocket, state: AppState):
        self.ws = ws
        self.state = state
        self.config = SessionConfig()
        self.pending: list[str] = []  # manual mode: the text of the next utterance
        self.feed: TextFeed | None = None  # sentence mode: the utterance whose text is still arriving
        self._feed_config, self._feed_queued = self.config, False  # its settings; queued yet?
        self.queue: asyncio.Queue[tuple[int, str | TextFeed, SessionConfig] | None] = asyncio.Queue()
        self.current: asyncio.Task | None = None
        self._send_lock = asyncio.Lock()
        self._next_id = 1

    async def send_json(self, payload: dict) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(payload, separators=(",", ":")))

    async def send_event(self, event: Message) -> None:
        await self.send_json(event_json(event))

    async def send_bytes(self, data: bytes) -> None:
        async with self._send_lock:
            await self.ws.send_bytes(data)

    async def send_error(self, err: APIError, utterance_id: int | None = None) -> None:
        await self.send_event(ErrorEvent(utterance_id=utterance_id, **err.body()))

    async def run(self) -> None:
        await self.send_event(SessionCreated(sample_rate=self.config.sample_rate,
                                             model=self.state.model_name))
        worker = asyncio.create_task(self._work())
        unregister = self.state.drain.on_start(lambda: self.queue.put_nowait(_DRAIN))
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") is None:
                    await self.send_error(APIError(400, "Send JSON text messages.", code="invalid_message"))
                    continue
                if await self._handle(message["text"]):
                    await self.queue.put(None)  # session.close: finish the queue, then stop
                    await worker
                    await self.send_event(SessionDone())
                    await self.ws.close()
                    return
        except (WebSocketDisconnect, RuntimeError):  # RuntimeError: the worker closed it (drain)
            return
        finally:
            unregister()
            if self.feed is not None:
                self.feed.cancel()
            # Disconnect: abort the running utterance now (frees its KV), then stop the worker.
            if self.current is not None:
                self.current.cancel()
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await worker

    async def _handle(self, text: str) -> bool:
        """One client message; True when the session should close."""
        try:
            message = json.loads(text)
        except json.JSONDecodeError:
            await self.send_error(APIError(400, "Messages must be JSON objects.", code="invalid_json"))
            return False
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "session.config":
            try:
                self.config = SessionConfig.model_validate(message)
            except ValidationError as exc:
                await self.send_error(validation_error(exc.errors(), in_body=False, model=SessionConfig))
        elif kind == "input.text":
            piece = message.get("text")
            if not isinstance(piece, str):
                await self.send_error(APIError(400, "input.text needs a string 'text'.", param="text"))
            elif self.feed is not None or (not self.pending and self.config.flush == "sentence"):
                await self._feed_text(piece)
            elif sum(map(len, self.pending)) + len(piece) > MAX_INPUT_CHARS:
                await self.send_error(_too_long())
            else:
                self.pending.append(piece)
        elif kind == "input.done":
            if self.feed is not None:
                feed, self.feed = self.feed, None
                feed.close()  # the rest is spoken
                if not self._feed_queued:  # only whitespace arrived
                    await self.send_error(APIError(400, EMPTY_INPUT_DONE, code="empty_input"))
                return False
            text, self.pending = "".join(self.pending), []
            if not text.strip():
                await self.send_error(APIError(400, EMPTY_INPUT_DONE, code="empty_input"))
            elif not await self._refused():
                await self.queue.put((self._next_id, text, self.config))
                self._next_id += 1
        elif kind == "input.cancel":
            while not self.queue.empty():
                if isinstance(item := self.queue.get_nowait(), tuple) and isinstance(item[1], TextFeed):
                    item[1].cancel()
            if self.feed is not None:  # its sentences not yet spoken go too
                self.feed.cancel()
                self.feed = None
            if self.current is not None:
                self.current.cancel()
        elif kind == "session.close":
            if self.feed is not None:  # the text that arrived is spoken to its end
                self.feed.close()
                self.feed = None
            return True
        else:
            await self.send_error(APIError(400, "Unknown message type; expected session.config, input.text, "
                                                "input.done, input.cancel or session.close.",
                                           param="type", code="invalid_message"))
        return False

    async def _refused(self) -> bool:
        """Whether a new utterance must be refused (the server drains, or too many wait): says why."""
        if self.state.drain.draining:
            await self.send_error(APIError(503, "The server is shutting down; no new utterances.",
                                           code="server_shutting_down"))
            return True
        if self.queue.qsize() >= MAX_QUEUED:
            limit = f"At most {MAX_QUEUED} utterances may wait per connection; wait for an audio.done."
            await self.send_error(APIError(429, limit, code="too_many_utterances"))
            return True
        return False

    async def _feed_text(self, piece: str) -> None:
        """Sentence mode: text for the utterance still arriving. Its first words queue it (with the
        session's settings now); each sentence is spoken once complete."""
        if self.feed is None:
            try:
                service, _ = self.state.require_ready()
            except APIError as err:
                await self.send_error(err)
                return
            config = self.config
            max_s = None if config.flush_max_ms is None else config.flush_max_ms / 1000
            self.feed = service.text_feed(config.flush_max_chars, max_s)
            self._feed_config, self._feed_queued = config, False
        if self.feed.received_chars + len(piece) > MAX_INPUT_CHARS:
            await self.send_error(_too_long())
            return
        if not self._feed_queued and piece.strip():
            if await self._refused():
                self.feed.cancel()
                self.feed = None
                return
            await self.queue.put((self._next_id, self.feed, self._feed_config))
            self._next_id += 1
            self._feed_queued = True
        self.feed.push(piece)

    async def _work(self) -> None:
        while (item := await self.queue.get()) is not None:
            if item is _DRAIN:
                await self._close_for_drain()
                return
            uid, text, config = item
            if self.state.drain.cut.is_set():
                await self.send_event(_empty_done(uid).model_copy(
                    update={"cancelled": True, "reason": SHUTDOWN_REASON, "finish_reason": "abort"}))
                continue
            done = _empty_done(uid)  # kept up to date by _speak, so that a cancelled one is complete too
            self.current = asyncio.create_task(self._speak(uid, text, config, done))
            await asyncio.wait({self.current})
            cancelled = self.current.cancelled()
            if not cancelled and self.current.exception() is not None:  # e.g. the socket closed mid-send
                log.debug("utterance %d ended: %r", uid, self.current.exception())
            self.current = None
            if cancelled:
                await self.send_event(done.model_copy(update={"cancelled": True, "finish_reason": "abort"}))

    async def _send_words(self, uid: int, words: WordClock | None, final: bool = False) -> None:
        if words is not None and (due := words.due(final)):
            await self.send_event(AudioAlignment(utterance_id=uid, words=due))

    async def _close_for_drain(self) -> None:
        """Everything queued before the drain has been spoken (or cut at its deadline): say so and close."""
        with contextlib.suppress(Exception):
            await self.send_event(SessionDone(reason=SHUTDOWN_REASON))
            await self.ws.close(code=1001, reason="server shutting down")

    async def _speak(self, uid: int, text: str | TextFeed, config: SessionConfig, done: AudioDone) -> None:
        state = self.state
        if isinstance(text, TextFeed):
            started = await _unless_cut(text.started(), state.drain.cut)
            if started is None:  # the drain deadline passed while the utterance waited for its first words
                done.finish_reason, done.cancelled, done.reason = "abort", True, SHUTDOWN_REASON
                await self.send_event(done)
                return
            if not started:  # closed before a word was speakable
                await self.send_error(service_error(NothingToSay("the input holds nothing this model can "
                                                                 "speak")), uid)
                return
        received = time.perf_counter()  # sentence mode: when its first sentence was complete
        try:
            service, resolver = state.require_ready()
            voice_arg = {"id": config.voice.id} if isinstance(config.voice, VoiceId) else config.voice
            voice, _ = await resolver.resolve(voice_arg, config.ref_audio, config.ref_text)
            options = synthesis_options(config, word_timings=config.word_timings)
            synth = open_synthesis(service, text, voice, options)
        except APIError as err:
            await self.send_error(err, uid)
            return
        run = SpeechRun(state.metrics, "pcm", "websocket", received)
        pipeline = OutputPipeline("pcm", synth.sample_rate, speed=config.speed, out_rate=config.sample_rate)
        status, total, reason = "aborted", 0, None
        trace = _Trace()
        words = WordClock(synth, pipeline) if config.word_timings else None
        await self.send_event(AudioStart(utterance_id=uid, sample_rate=config.sample_rate))
        try:
            async for chunk in until_cut(synth, state.drain):
                before = pipeline.audio_seconds
                data = pipeline.process(chunk)
                if data:
                    await self.send_bytes(data)
                    total += len(data)
                    run.sent_audio(pipeline.audio_seconds - before)
                    _update_done(done, synth, total, pipeline, run)
                    await self._send_words(uid, words)
                    await self.send_event(AudioProgress(**_totals(done), chunk=trace.chunk(synth.stats)))
            if data := pipeline.finish():
                await self.send_bytes(data)
                total += len(data)
            await self._send_words(uid, words, final=True)
            status = "ok"
        except ServerShuttingDown:
            status, reason = "aborted", SHUTDOWN_REASON
        except Exception as exc:
            err = stream_error(exc)
            status = outcome_status(err)
            await self.send_error(err, uid)
        finally:
            await close_quietly(synth)
            run.finish(synth, status, pipeline.audio_seconds)
            _update_done(done, synth, total, pipeline, run)  # also when cancelled: _work sends it then
        done.finish_reason = {"ok": synth.stats.finish_reason, "error": "error"}.get(status, "abort")
        done.cancelled, done.reason = reason is not None, reason
        await self.send_event(done)


async def _unless_cut(waiting, cut: asyncio.Event):
    """The awaitable's result, or None if `cut` is set first (then it is cancelled)."""
    task, deadline = asyncio.ensure_future(waiting), asyncio.ensure_future(cut.wait())
    try:
        await asyncio.wait({task, deadline}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        deadline.cancel()
        if not task.done():
            task.cancel()
    return task.result() if task.done() and not task.cancelled() else None


def _too_long() -> APIError:
    return APIError(400, f"An utterance holds at most {MAX_INPUT_CHARS} characters.", param="text",
                    code="string_above_max_length")


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _empty_done(uid: int) -> AudioDone:
    """An utterance's audio.done before anything was generated."""
    return AudioDone(utterance_id=uid, samples=0, tokens=0, steps=0, drafted=0, accepted=0,
                     acceptance_rate=None, mean_accepted_len=None, total_bytes=0, audio_seconds=0.0,
                     ttfa_ms=None, usage=Usage(input_tokens=0, output_tokens=0, total_tokens=0),
                     finish_reason=None, cancelled=False)


def _update_done(done: AudioDone, synth, total_bytes: int, pipeline: OutputPipeline, run: SpeechRun) -> None:
    """Brings the utterance's audio.done up to date with what has been generated and sent so far."""
    st = synth.stats
    ttfa_s = run.outcome.ttfa_s
    now = dict(samples=total_bytes // 2, tokens=st.generated_tokens, steps=st.steps,
               drafted=st.drafted_tokens, accepted=st.accepted_tokens,
               acceptance_rate=_round(st.acceptance_rate),
               mean_accepted_len=_round(st.mean_accepted_len), total_bytes=total_bytes,
               audio_seconds=round(pipeline.audio_seconds, 4), usage=Usage(**usage_of(synth)),
               ttfa_ms=None if ttfa_s is None else round(ttfa_s * 1000, 1), finish_reason=st.finish_reason)
    for name, value in now.items():
        setattr(done, name, value)


def _totals(done: AudioDone) -> dict:
    """The running counters an audio.progress repeats from the utterance's audio.done."""
    return done.model_dump(include={"utterance_id", "samples", "tokens", "steps", "drafted", "accepted",
                                    "acceptance_rate", "mean_accepted_len"})


class _Trace:
    """Per-chunk acceptance: the counters' growth since the previous audio.progress."""

    def __init__(self):
        self._last = (0, 0, 0, 0)

    def chunk(self, st) -> ChunkAcceptance:
        now = (st.generated_tokens, st.steps, st.drafted_tokens, st.accepted_tokens)
        tokens, steps, drafted, accepted = (a - b for a, b in zip(now, self._last, strict=True))
        self._last = now
        return ChunkAcceptance(tokens=tokens, steps=steps, drafted=drafted, accepted=accepted)


async def _deny(websocket: WebSocket, err: APIError) -> None:
    """Refuse the handshake with a real HTTP status (401, 403, 503) and an OpenAI-shaped body."""
    await websocket.send_denial_response(JSONResponse(err.body(), status_code=err.status))


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket) -> None:
    state = get_ws_state(websocket)
    if not origin_allowed(websocket.headers, state.settings.allowed_origins):
        await _deny(websocket, APIError(403, "This Origin may not open the stream; the server allows its own "
                                             "and those in --cors-origins.", code="origin_not_allowed"))
        return
    if not websocket_authorized(websocket.headers, websocket.query_params, state.settings.api_key):
        await _deny(websocket, APIError(401, "Incorrect API key provided.", code="invalid_api_key"))
        return
    if state.drain.draining:
        await _deny(websocket, APIError(503, "The server is shutting down.", code="server_shutting_down"))
        return
    await websocket.accept(subprotocol=chosen_subprotocol(websocket.headers))
    with state.drain.track():
        await Session(websocket, state).run()

