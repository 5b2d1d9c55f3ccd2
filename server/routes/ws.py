"""WebSocket /v1/audio/speech/stream: live playback, several utterances per connection (PROTOCOL)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Literal

from fastapi import APIRouter, WebSocket
from pydantic import ConfigDict, Field, ValidationError
from starlette.websockets import WebSocketDisconnect

from server.audio.formats import OUTPUT_SAMPLE_RATE
from server.audio.pipeline import OutputPipeline
from server.errors import APIError, validation_error
from server.schemas import MAX_INPUT_CHARS, SamplingFields, VoiceId
from server.state import AppState, get_ws_state
from server.streaming import (
    SpeechRun,
    close_quietly,
    open_synthesis,
    service_error,
    synthesis_options,
    usage_of,
)

router = APIRouter()
log = logging.getLogger("pcgtts.server")

PROTOCOL = """\
`WS /v1/audio/speech/stream` (API key, if set: `Authorization: Bearer KEY` or `?api_key=KEY`).

Client -> server, JSON text messages:
* `{"type": "session.config", ...}`: `voice`, `speed`, `sample_rate` (8000-48000, default 24000) and the
  speech extensions (`seed`, `temperature`, `acceptance`, `ref_audio`/`ref_text`, ...); applies to
  utterances started after it
* `{"type": "input.text", "text": "..."}`: appends to the pending utterance
* `{"type": "input.done"}`: speaks the pending text (queued behind a running utterance)
* `{"type": "input.cancel"}`: aborts the running utterance and drops queued ones
* `{"type": "session.close"}`: finishes queued utterances, then closes

Server -> client:
* `{"type": "session.created", "format": "pcm", "sample_rate", "model"}`
* `{"type": "audio.start", "utterance_id", "format": "pcm", "sample_rate", "channels": 1}`
* binary frames: 16-bit little-endian mono PCM at `sample_rate`
* `{"type": "audio.progress", "utterance_id", "samples", "tokens", "drafted", "accepted", "acceptance_rate"}`
* `{"type": "audio.done", "utterance_id", "total_bytes", "audio_seconds", "ttfa_ms", "usage", "drafted",
  "accepted", "acceptance_rate", "finish_reason", "cancelled"}`
* `{"type": "error", "utterance_id"?, "error": {"message", "type", "param", "code"}}`
* `{"type": "session.done"}`

Closing the socket aborts the running utterance at once and frees its KV cache.
"""


class SessionConfig(SamplingFields):
    model_config = ConfigDict(extra="forbid")
    type: Literal["session.config"] = "session.config"
    model: str | None = None
    voice: str | VoiceId | None = None
    response_format: Literal["pcm"] = "pcm"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    sample_rate: int = Field(OUTPUT_SAMPLE_RATE, ge=8000, le=48000)
    instructions: str | None = None


def authorized(ws: WebSocket, api_key: str | None) -> bool:
    if not api_key:
        return True
    header = ws.headers.get("authorization", "")
    return header == f"Bearer {api_key}" or ws.query_params.get("api_key") == api_key


class Session:
    def __init__(self, ws: WebSocket, state: AppState):
        self.ws = ws
        self.state = state
        self.config = SessionConfig()
        self.pending: list[str] = []
        self.queue: asyncio.Queue[tuple[int, str, SessionConfig] | None] = asyncio.Queue()
        self.current: asyncio.Task | None = None
        self._send_lock = asyncio.Lock()
        self._next_id = 1

    async def send_json(self, payload: dict) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(payload, separators=(",", ":")))

    async def send_bytes(self, data: bytes) -> None:
        async with self._send_lock:
            await self.ws.send_bytes(data)

    async def send_error(self, err: APIError, utterance_id: int | None = None) -> None:
        payload = {"type": "error", **err.body()}
        if utterance_id is not None:
            payload["utterance_id"] = utterance_id
        await self.send_json(payload)

    async def run(self) -> None:
        await self.send_json({"type": "session.created", "format": "pcm",
                              "sample_rate": self.config.sample_rate, "model": self.state.model_name})
        worker = asyncio.create_task(self._work())
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
                    await self.send_json({"type": "session.done"})
                    await self.ws.close()
                    return
        except WebSocketDisconnect:
            return
        finally:
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
                await self.send_error(validation_error(exc.errors(), in_body=False))
        elif kind == "input.text":
            piece = message.get("text")
            if not isinstance(piece, str):
                await self.send_error(APIError(400, "input.text needs a string 'text'.", param="text"))
            elif sum(map(len, self.pending)) + len(piece) > MAX_INPUT_CHARS:
                limit = f"An utterance holds at most {MAX_INPUT_CHARS} characters."
                await self.send_error(APIError(400, limit,
                                               param="text", code="string_above_max_length"))
            else:
                self.pending.append(piece)
        elif kind == "input.done":
            text, self.pending = "".join(self.pending), []
            if text.strip():
                await self.queue.put((self._next_id, text, self.config))
                self._next_id += 1
        elif kind == "input.cancel":
            while not self.queue.empty():
                self.queue.get_nowait()
            if self.current is not None:
                self.current.cancel()
        elif kind == "session.close":
            return True
        else:
            await self.send_error(APIError(400, "Unknown message type; expected session.config, input.text, "
                                                "input.done, input.cancel or session.close.",
                                           param="type", code="invalid_message"))
        return False

    async def _work(self) -> None:
        while (item := await self.queue.get()) is not None:
            uid, text, config = item
            progress: dict = {}
            self.current = asyncio.create_task(self._speak(uid, text, config, progress))
            await asyncio.wait({self.current})
            cancelled = self.current.cancelled()
            if not cancelled and self.current.exception() is not None:  # e.g. the socket closed mid-send
                log.debug("utterance %d ended: %r", uid, self.current.exception())
            self.current = None
            if cancelled:
                await self.send_json({**progress, "type": "audio.done", "utterance_id": uid,
                                      "cancelled": True})

    async def _speak(self, uid: int, text: str, config: SessionConfig, progress: dict) -> None:
        state = self.state
        received = time.perf_counter()
        try:
            service, resolver = state.require_ready()
            voice_arg = {"id": config.voice.id} if isinstance(config.voice, VoiceId) else config.voice
            voice, _ = await resolver.resolve(voice_arg, config.ref_audio, config.ref_text)
            synth = open_synthesis(service, text, voice, synthesis_options(config))
        except APIError as err:
            await self.send_error(err, uid)
            return
        run = SpeechRun(state.metrics, "pcm", "websocket", received)
        pipeline = OutputPipeline("pcm", synth.sample_rate, speed=config.speed, out_rate=config.sample_rate)
        status, total = "aborted", 0
        await self.send_json({"type": "audio.start", "utterance_id": uid, "format": "pcm",
                              "sample_rate": config.sample_rate, "channels": 1})
        try:
            async for chunk in synth:
                before = pipeline.audio_seconds
                data = pipeline.process(chunk)
                if data:
                    await self.send_bytes(data)
                    total += len(data)
                    run.sent_audio(pipeline.audio_seconds - before)
                    progress.update(self._progress(uid, synth, total))
                    await self.send_json({"type": "audio.progress", **progress})
            if data := pipeline.finish():
                await self.send_bytes(data)
                total += len(data)
            status = "ok"
        except Exception as exc:
            status = "error"
            try:
                err = service_error(exc)
            except Exception:
                err = APIError(500, f"synthesis failed: {type(exc).__name__}", code="internal_error")
            await self.send_error(err, uid)
        finally:
            await close_quietly(synth)
            run.finish(synth, status, pipeline.audio_seconds)
        st = synth.stats
        await self.send_json({
            **self._progress(uid, synth, total), "type": "audio.done", "total_bytes": total,
            "audio_seconds": round(pipeline.audio_seconds, 4), "usage": usage_of(synth),
            "ttfa_ms": None if run.outcome.ttfa_s is None else round(run.outcome.ttfa_s * 1000, 1),
            "finish_reason": st.finish_reason, "cancelled": False})

    @staticmethod
    def _progress(uid: int, synth, total_bytes: int) -> dict:
        st = synth.stats
        rate = st.acceptance_rate
        return {"type": "audio.progress", "utterance_id": uid, "samples": total_bytes // 2,
                "tokens": st.generated_tokens, "drafted": st.drafted_tokens, "accepted": st.accepted_tokens,
                "acceptance_rate": None if rate is None else round(rate, 4)}


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket) -> None:
    state = get_ws_state(websocket)
    if not authorized(websocket, state.settings.api_key):
        await websocket.close(code=1008, reason="invalid API key")
        return
    await websocket.accept()
    await Session(websocket, state).run()

