"""The output formats the speech endpoint serves, and their HTTP content types.

Every format is produced at `OUTPUT_SAMPLE_RATE` (24 kHz, like OpenAI), mono. PCM is 16-bit signed
little-endian without a header.
"""

from __future__ import annotations

from typing import Literal

OUTPUT_SAMPLE_RATE = 24_000

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
RESPONSE_FORMATS: tuple[str, ...] = ("mp3", "opus", "aac", "flac", "wav", "pcm")

CONTENT_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/opus",  # Ogg-encapsulated Opus
    "aac": "audio/aac",  # ADTS frames
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


def content_type(fmt: str, sample_rate: int = OUTPUT_SAMPLE_RATE) -> str:
    """The Content-Type header; PCM carries its rate since it has no header of its own."""
    if fmt == "pcm":
        return f"audio/pcm;rate={sample_rate}"
    return CONTENT_TYPES[fmt]
