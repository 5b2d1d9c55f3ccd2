"""POST /v1/audio/speech: OpenAI's speech endpoint, streamed as audio bytes or as SSE events."""

from __future__ import annotations

import base64
import logging
import time
import uuid
from contextlib import aclosing

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pcgtts.server.audio.formats import CONTENT_TYPES, LENGTH_IN_HEADER, content_type
from pcgtts.server.audio.pipeline import OutputPipeline, encode_whole
from pcgtts.server.drain import Drain, ServerShuttingDown, StreamCut, until_cut
from pcgtts.server.errors import APIError, bad_request
from pcgtts.server.schemas import ErrorResponse, SpeechRequest, VoiceId
from pcgtts.server.state import get_state
from pcgtts.server.streaming import (
    AbortingStreamingResponse,
    ClientGone,
    SpeechRun,
    WordClock,
    chunks_after,
    close_quietly,
    next_or_gone,
    open_synthesis,
    outcome_status,
    sse_event,
    stream_error,
    synthesis_options,
    usage_of,
)

router = APIRouter(tags=["speech"])
log = logging.getLogger("pcgtts.server")

_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 422, 429, 500, 503)}
_AUDIO_CONTENT = {"content": {
    **{ctype: {} for ctype in CONTENT_TYPES.values()},
    "text/event-stream": {"example": 'data: {"type":"speech.audio.delta","audio":"<base64>"}\n\n'},
}, "description": "The audio (chunked), or SSE events when stream_format is 'sse'."}
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# The official openai SDK marks `with_streaming_response` requests with this header ("stream"); plain
# `create()` reads the whole body before it returns, so a stream would gain it nothing.
SDK_STREAMING_HEADER = "x-stainless-raw-response"


def wants_stream(body: SpeechRequest, request: Request) -> bool:
    """Whether the response streams. SSE always does, and `stream` decides when given. Unset, formats whose
    streamed bytes already make a complete file (mp3, opus, aac, pcm, G.711) stream; flac and wav, whose
    streamed header cannot hold the length, come whole unless the client reads a stream (the SDK's
    `with_streaming_response`): the file `create().write_to_file()` writes then opens in every reader."""
    if body.stream_format == "sse":
        return True
    if body.stream is not None:
        return body.stream
    if body.response_format not in LENGTH_IN_HEADER:
        return True
    return request.headers.get(SDK_STREAMING_HEADER, "").lower() == "stream"


@router.post("/v1/audio/speech", response_class=Response, responses={200: _AUDIO_CONTENT, **_ERRORS},
             summary="Generate speech (OpenAI-compatible), streamed")
async def create_speech(body: SpeechRequest, request: Request) -> Response:
    """Streams audio as soon as the first chunk is decoded (`stream_format: "audio"`, the default), or
    `speech.audio.delta` / `speech.audio.done` SSE events (`stream_format: "sse"`). Every format is
    mono at 24 kHz (`ulaw`/`alaw` 8 kHz); `pcm` is raw 16-bit little-endian. `flac` and `wav` come as
    complete files (lengths in their headers, Content-Length) unless `stream: true` or the openai SDK's
    `with_streaming_response` asks for a stream; `stream: false` returns any format whole."""
    received = time.perf_counter()
    request_id = f"req_{uuid.uuid4().hex[:24]}"  # in the x-request-id header, as OpenAI's API sends it
    state = get_state(request)
    service, resolver = state.require_ready()
    voice_arg = {"id": body.voice.id} if isinstance(body.voice, VoiceId) else body.voice
    voice, _ = await resolver.resolve(voice_arg, body.ref_audio, body.ref_text)
    sse = body.stream_format == "sse"
    if body.word_timings and not sse:
        raise bad_request("word_timings need stream_format 'sse' (the timings travel as its events).",
                          param="word_timings")
    streamed = wants_stream(body, request)
    run = SpeechRun(state.metrics, body.response_format, "sse" if sse else "audio" if streamed else "full",
                    received)
    synth = open_synthesis(service, body.input, voice,
                           synthesis_options(body, streaming=streamed, word_timings=body.word_timings))
    try:
        first = await next_or_gone(synth, request, state.drain.cut)  # errors (429, ...) get a status
    except ClientGone:
        run.finish(synth, "aborted", 0.0)
        return Response(status_code=499)
    except APIError as err:
        run.finish(synth, outcome_status(err), 0.0)
        raise

    if not streamed:
        whole = await _whole(body, request, synth, first, run, state.drain)
        whole.headers["x-request-id"] = request_id
        return whole
    pipeline = OutputPipeline(body.response_format, synth.sample_rate, speed=body.speed)
    headers = {**_STREAM_HEADERS, "x-request-id": request_id}
    if sse:
        words = WordClock(synth, pipeline) if body.word_timings else None
        return AbortingStreamingResponse(_sse_body(synth, first, pipeline, run, state.drain, words),
                                         media_type="text/event-stream", headers=headers)
    client = f"{request.client.host}:{request.client.port}" if request.client else "?"
    about = f"request {request_id} (POST /v1/audio/speech, {body.response_format}, from {client})"
    return AbortingStreamingResponse(_audio_body(synth, first, pipeline, run, state.drain, about),
                                     media_type=content_type(body.response_format), headers=headers)


async def _encoded_audio(synth, first, pipeline: OutputPipeline, run: SpeechRun, drain: Drain):
    """The requested format's bytes as chunks are produced, then the encoder's tail; meters what is sent.
    Raises ServerShuttingDown when the drain deadline passes first."""
    async with aclosing(until_cut(chunks_after(first, synth), drain)) as chunks:
        async for chunk in chunks:
            before = pipeline.audio_seconds
            data = pipeline.process(chunk)
            if data:
                run.sent_audio(pipeline.audio_seconds - before)
                yield data
    if tail := pipeline.finish():
        run.sent_audio(0.0)
        yield tail


async def _audio_body(synth, first, pipeline: OutputPipeline, run: SpeechRun, drain: Drain, about: str):
    """Raw audio has no in-band channel: a failure ends the chunked body without its last chunk, so the
    client sees a broken transfer, never a silently short file. A cut at the drain deadline is expected:
    one INFO line naming the request (`about`), no error."""
    status = "aborted"
    try:
        async with aclosing(_encoded_audio(synth, first, pipeline, run, drain)) as encoded:
            async for data in encoded:
                yield data
        status = "ok"
    except ServerShuttingDown:
        log.info("%s cut at the drain deadline after %.1f s of audio: the client gets an unfinished transfer",
                 about, pipeline.audio_seconds)
        raise StreamCut() from None
    except Exception:
        status = "error"
        raise
    finally:
        await close_quietly(synth)
        run.finish(synth, status, pipeline.audio_seconds)


async def _sse_body(synth, first, pipeline: OutputPipeline, run: SpeechRun, drain: Drain,
                    words: WordClock | None):
    """speech.audio.delta events; with word timings asked for, a speech.audio.alignment after a delta
    whose audio reached the start of new words (the rest before speech.audio.done)."""
    status = "aborted"
    try:
        async with aclosing(_encoded_audio(synth, first, pipeline, run, drain)) as encoded:
            async for data in encoded:
                yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
                if words is not None and (due := words.due()):
                    yield _alignment_event(due, pipeline)
        if words is not None and (due := words.due(final=True)):
            yield _alignment_event(due, pipeline)
        yield sse_event({"type": "speech.audio.done", "usage": usage_of(synth)})
        status = "ok"
    except Exception as exc:  # headers are gone: report in-band, like vLLM-Omni's terminal error event
        status = "error"
        yield sse_event({"type": "speech.audio.error", **stream_error(exc).body()})
    finally:
        await close_quietly(synth)
        run.finish(synth, status, pipeline.audio_seconds)


def _alignment_event(words: list[dict], pipeline: OutputPipeline) -> bytes:
    return sse_event({"type": "speech.audio.alignment", "sample_rate": pipeline.out_rate, "words": words})


async def _whole(body: SpeechRequest, request: Request, synth, first, run: SpeechRun,
                 drain: Drain) -> Response:
    """stream=false: wait for the whole utterance (each sentence decoded in one pass), send it at once;
    a 503 `server_shutdown` if the drain deadline passes first."""
    rate = synth.sample_rate
    parts = [] if first is None else [first]
    try:
        while (chunk := await next_or_gone(synth, request, drain.cut)) is not None:
            parts.append(chunk)
    except ClientGone:
        run.finish(synth, "aborted", 0.0)
        return Response(status_code=499)
    except APIError as err:
        run.finish(synth, outcome_status(err), 0.0)
        raise
    audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    data = encode_whole(body.response_format, audio, rate, speed=body.speed)
    seconds = audio.size / rate / body.speed
    run.sent_audio(0.0)
    run.finish(synth, "ok", seconds)
    st = synth.stats
    facts = {**usage_of(synth), "audio_seconds": round(seconds, 3), "drafted_tokens": st.drafted_tokens,
             "accepted_tokens": st.accepted_tokens, "acceptance_rate": st.acceptance_rate}
    headers = {f"x-pcgtts-{k.replace('_', '-')}": str(v if not isinstance(v, float) else round(v, 4))
               for k, v in facts.items() if v is not None}
    return Response(data, media_type=content_type(body.response_format), headers=headers)
