"""Resolving the `voice` of a request to the engine's VoicePrompt (reference codes + transcript).

Order: inline `ref_audio` (+ `ref_text`) > uploaded voice by id > preset by name > uploaded voice by name >
an OpenAI built-in name (alloy, echo, ...) mapped onto the presets, so stock clients work unchanged. Names
match ignoring case (Unicode case folding), as they are made unique; a voice that is none of these is 404.
Codes of uploaded voices are computed once per codec and cached in the store; a small in-memory LRU
keeps hot voices off the disk.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import numpy as np
from pcgtts.server.audio.decode import (
    ACCEPTED_AUDIO,
    AudioDecodeError,
    DecodedAudio,
    decode_audio,
    decode_base64_audio,
)
from pcgtts.server.errors import APIError, bad_request, not_found
from pcgtts.server.voice_store import StoredVoice, VoiceStore, name_key
from pcgtts.tts import ReferenceClip, TTSService, VoicePrompt

OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer",
                 "verse", "marin", "cedar")


class VoiceLimits:
    def __init__(self, max_upload_bytes: int, min_seconds: float, max_seconds: float):
        self.max_upload_bytes = max_upload_bytes
        self.min_seconds = min_seconds
        self.max_seconds = max_seconds

    def check_size(self, data: bytes, param: str) -> None:
        if len(data) > self.max_upload_bytes:
            raise APIError(413, f"{param} is {len(data)} bytes; the limit is {self.max_upload_bytes} bytes.",
                           param=param, code="file_too_large")

    def decode(self, data: bytes, param: str) -> DecodedAudio:
        self.check_size(data, param)
        try:
            audio = decode_audio(data)
        except AudioDecodeError as exc:
            raise bad_request(f"{param}: {exc}; send {ACCEPTED_AUDIO} audio.", param=param,
                              code="unsupported_audio_format") from exc
        if not self.min_seconds <= audio.duration <= self.max_seconds:
            raise bad_request(f"{param} lasts {audio.duration:.2f} s; reference clips must last between "
                              f"{self.min_seconds:g} and {self.max_seconds:g} s.", param=param,
                              code="invalid_audio_duration")
        if float(np.max(np.abs(audio.samples))) < 1e-4:
            raise bad_request(f"{param} is silent.", param=param, code="silent_audio")
        return audio


class VoiceResolver:
    def __init__(self, service: TTSService, store: VoiceStore, limits: VoiceLimits, cache_size: int = 64):
        self.service = service
        self.store = store
        self.limits = limits
        self._presets = service.preset_voices()  # name -> VoicePrompt
        self._cache: OrderedDict[str, VoicePrompt] = OrderedDict()
        self._cache_size = cache_size

    @property
    def preset_names(self) -> list[str]:
        return list(self._presets)

    def preset_named(self, name: str) -> tuple[str, VoicePrompt] | None:
        """(the preset's own name, its prompt) for `name` ignoring case, or None."""
        key = name_key(name)
        return next(((n, v) for n, v in self._presets.items() if name_key(n) == key), None)

    def default_voice(self) -> VoicePrompt | None:
        return next(iter(self._presets.values()), None)

    def forget(self, voice_id: str) -> None:
        self._cache.pop(voice_id, None)

    async def prompt_for_stored(self, voice: StoredVoice) -> VoicePrompt:
        """Codes from the cache or the store, else computed from the stored audio and saved."""
        if (hit := self._cache.get(voice.id)) is not None:
            self._cache.move_to_end(voice.id)
            return hit
        key = self.service.codec_key
        codes = await asyncio.to_thread(self.store.load_codes, voice.id, key)
        if codes is None:
            audio, rate = await asyncio.to_thread(self.store.load_audio, voice.id)
            prompt = await asyncio.to_thread(self.service.encode_voice, audio, rate, voice.transcript)
            await asyncio.to_thread(self.store.save_codes, voice.id, key, prompt.codes)
        else:
            prompt = VoicePrompt(codes=codes, transcript=voice.transcript)
        self._cache[voice.id] = prompt
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return prompt

    async def inline(self, ref_audio: str, ref_text: str | None) -> ReferenceClip:
        if not ref_text or not ref_text.strip():
            raise bad_request("ref_text (the transcript of ref_audio) is required with ref_audio.",
                              param="ref_text", code="missing_required_parameter")
        try:
            data = decode_base64_audio(ref_audio)
        except AudioDecodeError as exc:
            raise bad_request(str(exc), param="ref_audio", code="invalid_base64") from exc
        audio = await asyncio.to_thread(self.limits.decode, data, "ref_audio")
        return ReferenceClip(audio.samples, audio.sample_rate, ref_text.strip())  # the synthesis encodes it

    async def resolve(self, voice: str | dict | None, ref_audio: str | None = None,
                      ref_text: str | None = None) -> tuple[VoicePrompt | ReferenceClip | None, str]:
        """-> (voice for TTSService.synthesize, None for the model's own default; kind:
        preset|uploaded|inline)."""
        if ref_audio:
            return await self.inline(ref_audio, ref_text), "inline"
        if voice is None:
            return self.default_voice(), "preset"
        by_id = isinstance(voice, dict)
        key = voice["id"] if by_id else voice
        preset = self.preset_named(key)
        if not by_id and preset is not None:
            return preset[1], "preset"
        stored = self.store.get(key) or self.store.find_by_name(key)
        if stored is not None:
            return await self.prompt_for_stored(stored), "uploaded"
        if preset is not None:
            return preset[1], "preset"
        if key.lower() in OPENAI_VOICES and self._presets:
            names = self.preset_names
            return self._presets[names[OPENAI_VOICES.index(key.lower()) % len(names)]], "preset"
        raise not_found(f"Voice {key!r} not found. GET /v1/audio/voices lists the voices.",
                        param="voice.id" if by_id else "voice", code="voice_not_found")
