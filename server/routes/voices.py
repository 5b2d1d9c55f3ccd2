"""Voices: upload a reference clip + transcript once, then use it by name or {"id": ...}.

POST /v1/audio/voices (multipart, OpenAI's `audio_sample` + `name`, plus `transcript`), GET (list, parsed by
OpenAI-list and Kokoro-style clients), GET/DELETE /v1/audio/voices/{id}. Presets of the model are listed
too and cannot be deleted.
"""

from __future__ import annotations

import asyncio
import re
import unicodedata

import numpy as np
from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse
from pcgtts.server.errors import APIError, bad_request, not_found
from pcgtts.server.schemas import ErrorResponse, VoiceDeleted, VoiceList, VoiceResource
from pcgtts.server.state import AppState, get_state
from pcgtts.server.voice_store import StoredVoice, VoiceExistsError, name_key

router = APIRouter(tags=["voices"])
_ERRORS = {code: {"model": ErrorResponse} for code in (400, 401, 404, 409, 413, 503)}
_DELETE_ERRORS = {**_ERRORS, 403: {"model": ErrorResponse, "description": "a preset voice of the model"}}
_NAME = re.compile(r"^[\w][\w .'-]{0,63}$")


def _uploaded(v: StoredVoice) -> VoiceResource:
    return VoiceResource(id=v.id, name=v.name, created_at=v.created_at, type="audio_sample", kind="uploaded",
                         transcript=v.transcript, duration=v.duration)


def _preset(state: AppState, name: str) -> VoiceResource | None:
    """The preset named `name`, ignoring case (as names are made unique), or None."""
    key = name_key(name)
    return next((p for p in _presets(state) if name_key(p.id) == key), None)


def _presets(state: AppState) -> list[VoiceResource]:
    if state.resolver is None:
        return []
    return [VoiceResource(id=name, name=name, created_at=state.started_at, type="preset", kind="preset",
                          transcript=prompt.transcript or None)
            for name, prompt in state.service.preset_voices().items()]


@router.get("/v1/audio/voices", response_model=VoiceList, responses=_ERRORS, summary="List voices")
async def list_voices(request: Request) -> VoiceList:
    """Presets of the served model first, then uploaded voices. `data` holds OpenAI-style voice objects,
    `voices` the plain names (the Kokoro-FastAPI shape)."""
    state = get_state(request)
    data = _presets(state) + [_uploaded(v) for v in state.store.list()]
    return VoiceList(data=data, voices=[v.name for v in data])


@router.post("/v1/audio/voices", response_model=VoiceResource, status_code=201,
             responses={200: {"model": VoiceResource, "description": "A retry of an upload already stored "
                                                                    "(same name, transcript and audio)."},
                        **_ERRORS},
             summary="Upload a voice")
async def create_voice(
    request: Request,
    name: str = Form(..., min_length=1, description="Unique name, used as `voice` in speech requests: "
                                                   "1-64 letters, digits, spaces, '_', '.', \"'\" or '-'."),
    audio_sample: UploadFile = File(..., description="Reference clip: WAV, FLAC, MP3 or OGG, 1-30 s."),
    transcript: str | None = Form(None, description="What the clip says (needed to clone the voice)."),
    ref_text: str | None = Form(None, description="Alias of `transcript` (vLLM-Omni)."),
    consent: str | None = Form(None, description="OpenAI's consent id; stored, not checked."),
    type: str | None = Form(None, description="OpenAI's creation type; only 'audio_sample' is supported."),
) -> VoiceResource:
    state = get_state(request)
    service, _ = state.require_ready()
    if type not in (None, "audio_sample"):
        raise bad_request("Only voices made from an audio sample are supported.", param="type")
    name = unicodedata.normalize("NFC", name.strip())
    if not _NAME.match(name):
        raise bad_request("name must be 1-64 letters, digits, spaces, '_', '.', \"'\" or '-'.", param="name")
    if any(name_key(name) == name_key(preset) for preset in service.preset_voices()):
        raise APIError(409, f"{name!r} is a preset voice name (names ignore case).", param="name",
                       code="voice_exists")
    text = next((t.strip() for t in (transcript, ref_text) if t and t.strip()), "")
    if not text:
        raise bad_request("transcript (what the clip says) is required.", param="transcript",
                          code="missing_required_parameter")
    if len(text) > 2000:
        raise bad_request("transcript is longer than 2000 characters.", param="transcript",
                          code="string_above_max_length")
    data = await audio_sample.read(state.limits.max_upload_bytes + 1)
    audio = await asyncio.to_thread(state.limits.decode, data, "audio_sample")
    if (existing := await asyncio.to_thread(_same_upload, state, name, text, audio)) is not None:
        return existing  # a retry whose first reply was lost: the same voice again, not a 409
    if state.store.count() >= state.settings.max_voices:
        raise APIError(409, f"The server keeps at most {state.settings.max_voices} voices; delete one first.",
                       code="too_many_voices")
    prompt = await asyncio.to_thread(service.encode_voice, audio.samples, audio.sample_rate, text)
    try:
        voice = await asyncio.to_thread(state.store.create, name, text, audio.samples, audio.sample_rate,
                                        consent)
    except VoiceExistsError as exc:
        raise APIError(409, f"A voice named {name!r} exists already (names ignore case); a retry of the "
                            "same upload (same name, transcript and audio) returns it instead.",
                       param="name", code="voice_exists") from exc
    await asyncio.to_thread(state.store.save_codes, voice.id, service.codec_key, prompt.codes)
    return _uploaded(voice)


def _same_upload(state: AppState, name: str, transcript: str, audio) -> JSONResponse | None:
    """The stored voice (as a 200) when `name` is taken by exactly this upload; None when the name is free;
    VoiceExistsError's 409 comes from create() when it is taken by another clip."""
    stored = state.store.find_by_name(name)
    if stored is None or stored.transcript != transcript:
        return None
    samples, rate = state.store.load_audio(stored.id)
    if rate != audio.sample_rate or not np.array_equal(samples, np.asarray(audio.samples, np.float32)):
        return None
    return JSONResponse(_uploaded(stored).model_dump(), status_code=200)


def _find(state: AppState, voice_id: str) -> StoredVoice:
    voice = state.store.find(voice_id)
    if voice is None:
        raise not_found(f"No uploaded voice {voice_id!r}.", param="voice_id", code="voice_not_found")
    return voice


@router.get("/v1/audio/voices/{voice_id}", response_model=VoiceResource, responses=_ERRORS,
            summary="Get one voice")
async def get_voice(voice_id: str, request: Request) -> VoiceResource:
    state = get_state(request)
    if (preset := _preset(state, voice_id)) is not None:
        return preset
    return _uploaded(_find(state, voice_id))


@router.delete("/v1/audio/voices/{voice_id}", response_model=VoiceDeleted, responses=_DELETE_ERRORS,
               summary="Delete an uploaded voice")
async def delete_voice(voice_id: str, request: Request) -> VoiceDeleted:
    """Accepts the voice's id or name. A preset of the model is refused with 403: it exists, and it is not
    the client's to delete."""
    state = get_state(request)
    if (preset := _preset(state, voice_id)) is not None:
        raise APIError(403, f"{preset.name!r} is a preset voice of the model; presets cannot be deleted, "
                            "only uploaded voices can.", param="voice_id", code="preset_voice")
    voice = _find(state, voice_id)
    await asyncio.to_thread(state.store.delete, voice.id)
    if state.resolver is not None:
        state.resolver.forget(voice.id)
    return VoiceDeleted(id=voice.id)
