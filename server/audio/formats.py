"""The output formats the speech endpoint serves, and their HTTP content types.

Every format is produced at `OUTPUT_SAMPLE_RATE` (24 kHz, like OpenAI), mono, except the telephony
formats `ulaw` and `alaw` (G.711 mu-law / A-law, one byte per sample, headerless, 8 kHz as telephony
expects; extensions beyond OpenAI's list). PCM is 16-bit signed little-endian without a header.
"""

from __future__ import annotations

from typing import Literal

OUTPUT_SAMPLE_RATE = 24_000
TELEPHONY_SAMPLE_RATE = 8_000

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm", "ulaw", "alaw"]
RESPONSE_FORMATS: tuple[str, ...] = ("mp3", "opus", "aac", "flac", "wav", "pcm", "ulaw", "alaw")

CONTENT_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/opus",  # Ogg-encapsulated Opus
    "aac": "audio/aac",  # ADTS frames
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "ulaw": "audio/basic",  # RFC 2046: 8-bit mu-law, 8 kHz, mono
    "alaw": "audio/x-alaw-basic",
}


# Formats whose header states the length (FLAC's STREAMINFO total samples and MD5, WAV's RIFF and data sizes),
# which a stream must leave unknown (0, 0xFFFFFFFF) because its header leaves first: libsndfile cannot read
# such a FLAC, Python's `wave` and ffprobe misreport such a WAV. Whole responses fill them in.
LENGTH_IN_HEADER = frozenset({"flac", "wav"})


def output_rate(fmt: str) -> int:
    """The sample rate a response in `fmt` is produced at."""
    return TELEPHONY_SAMPLE_RATE if fmt in ("ulaw", "alaw") else OUTPUT_SAMPLE_RATE


def content_type(fmt: str, sample_rate: int = OUTPUT_SAMPLE_RATE) -> str:
    """The Content-Type header; PCM carries its rate since it has no header of its own."""
    if fmt == "pcm":
        return f"audio/pcm;rate={sample_rate}"
    return CONTENT_TYPES[fmt]
