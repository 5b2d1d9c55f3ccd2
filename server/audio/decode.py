"""Decoding reference audio that clients send (voice uploads, inline speaker prompts) to mono float32.

WAV, FLAC, MP3 and Ogg (Vorbis/Opus) go through libsndfile; AAC/M4A/WebM fall back to PyAV. Anything
else is rejected with a clear message instead of being guessed at.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import re
from dataclasses import dataclass

import av
import numpy as np
import soundfile as sf

_SNDFILE_FORMATS = {"WAV", "WAVEX", "FLAC", "MP3", "OGG", "RF64", "W64", "AIFF"}
_AV_FORMATS = {"aac", "mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "mp3", "ogg", "wav", "flac"}
_DATA_URL = re.compile(r"^data:(?P<mime>[\w/+.-]+)?(;[\w=.-]+)*;base64,", re.IGNORECASE)


# What the voice endpoints tell clients to send (AAC/M4A and WebM decode too, through PyAV).
ACCEPTED_AUDIO = "WAV, FLAC, MP3 or OGG"
NOT_AUDIO = "not audio in a format this server reads"
log = logging.getLogger("pcgtts.server")


class AudioDecodeError(ValueError):
    """The bytes are not audio in a format we accept; the message is for the client (no library internals)."""


@dataclass
class DecodedAudio:
    samples: np.ndarray  # float32 [n], mono
    sample_rate: int
    container: str  # e.g. "WAV", "FLAC", "MP3", "OGG", "aac"

    @property
    def duration(self) -> float:
        return self.samples.size / self.sample_rate


def _decode_pyav(data: bytes) -> DecodedAudio:
    try:
        with av.open(io.BytesIO(data)) as container:
            name = container.format.name
            if name not in _AV_FORMATS or not container.streams.audio:
                raise AudioDecodeError(NOT_AUDIO)
            rate = container.streams.audio[0].codec_context.sample_rate
            to_mono = av.AudioResampler(format="flt", layout="mono", rate=rate)
            chunks = [out.to_ndarray().reshape(-1) for frame in container.decode(audio=0)
                      for out in to_mono.resample(frame)]
    except AudioDecodeError:
        raise
    except (av.FFmpegError, ValueError) as exc:
        log.debug("audio the decoders refused: %s", exc)  # ffmpeg's words, for the operator
        raise AudioDecodeError(NOT_AUDIO) from exc
    if not chunks or not rate:
        raise AudioDecodeError("the audio stream holds no samples")
    return DecodedAudio(np.concatenate(chunks).astype(np.float32), int(rate), name)


def decode_audio(data: bytes) -> DecodedAudio:
    """Bytes of an audio file -> mono float32. Raises AudioDecodeError when it is not audio we accept."""
    if not data:
        raise AudioDecodeError("the audio file is empty")
    try:
        info = sf.info(io.BytesIO(data))
        if info.format not in _SNDFILE_FORMATS:
            raise AudioDecodeError(NOT_AUDIO)
        audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        decoded = DecodedAudio(audio.mean(axis=1).astype(np.float32), int(rate), info.format)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError):  # e.g. streamed FLAC: unknown length
        decoded = _decode_pyav(data)
    if decoded.samples.size == 0:
        raise AudioDecodeError("the audio file holds no samples")
    if not np.all(np.isfinite(decoded.samples)):
        raise AudioDecodeError("the audio holds non-finite samples")
    return decoded


def decode_base64_audio(text: str) -> bytes:
    """A base64 string or a `data:audio/...;base64,` URL -> raw bytes."""
    match = _DATA_URL.match(text)
    payload = text[match.end():] if match else text
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioDecodeError("ref_audio is neither base64 nor a base64 data URL") from exc
