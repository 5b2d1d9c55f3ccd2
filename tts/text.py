"""Splitting long input into the segments the TTS service synthesises one after another.

Used when the speech family has no splitter of its own (the demo family has `split_text`).
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"(?<=[.!?;:…])[\"')\]]*\s+|\n+")
_SOFT_BREAK = re.compile(r"(?<=[,;:–—])\s+")


def _split_long(piece: str, max_chars: int) -> list[str]:
    """A sentence longer than max_chars: break at commas/dashes, else at spaces."""
    out: list[str] = []
    for part in _SOFT_BREAK.split(piece):
        while len(part) > max_chars:
            cut = part.rfind(" ", 0, max_chars)
            cut = cut if cut > 0 else max_chars
            out.append(part[:cut].strip())
            part = part[cut:].strip()
        if part:
            out.append(part)
    merged: list[str] = []
    for part in out:  # re-join tiny fragments with their neighbour
        if merged and len(merged[-1]) + 1 + len(part) <= max_chars:
            merged[-1] = f"{merged[-1]} {part}"
        else:
            merged.append(part)
    return merged


def split_sentences(text: str, max_chars: int = 220) -> list[str]:
    """Text -> speakable segments in order, each at most max_chars long; short sentences are merged."""
    segments: list[str] = []
    for sentence in _SENTENCE_END.split(text.strip()):
        sentence = " ".join(sentence.split())
        if not sentence:
            continue
        for piece in _split_long(sentence, max_chars) if len(sentence) > max_chars else [sentence]:
            if segments and len(segments[-1]) + 1 + len(piece) <= max_chars // 3:
                segments[-1] = f"{segments[-1]} {piece}"  # "Hi. Yes." -> one segment
            else:
                segments.append(piece)
    return segments
