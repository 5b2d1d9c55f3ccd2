"""Splitting input into sentences, and sentences into the segments the TTS service synthesises.

One rule decides where a sentence ends, for whole inputs (the HTTP route) and for text that arrives piece
by piece (`SentenceStream`, the WebSocket's `"flush": "sentence"`): sentence-final punctuation (`.` `!` `?`
`…`, closing quotes or brackets may follow) then whitespace, unless the next word starts in lower case
("etc. and"), or the word before a full stop is an abbreviation ("Dr.", "e.g.", an initial "J.") or an
item number opening the sentence ("1. Apples"); a line break always ends one. A decimal point ("3.5") is
followed by no whitespace, so it never ends a sentence. The rule looks at most one character past the
whitespace, so text that arrives in pieces is cut exactly where the whole text would be.
"""

from __future__ import annotations

import re

# sentence-final punctuation, closing quotes or brackets, whitespace
_CANDIDATE = re.compile(r"[.!?…]+[\"'”’»)\]]*\s+")
_SOFT_BREAK = re.compile(r"(?<=[,;:–—])\s+")
ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "mx", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "cf", "e.g", "i.e", "approx",
    "dept", "est", "fig", "gen", "gov", "inc", "ltd", "co", "corp", "lt", "col", "capt", "sgt", "rev", "hon",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "no", "vol", "pp",
})


def _ends_sentence(line: str, start: int, match: re.Match, following: str) -> bool:
    """Whether the candidate `match` (punctuation + whitespace in `line`, within the sentence begun at
    `start`) ends that sentence, given the character after its whitespace."""
    if following.islower():
        return False
    if match.group().rstrip().rstrip("\"'”’»)]") != ".":  # "!", "?", "…", "...": the sentence ends
        return True
    before = line[start:match.start()].split()
    word = before[-1].lstrip("\"'“‘«([") if before else ""
    if word.lower() in ABBREVIATIONS or (len(word) == 1 and word.isupper()):
        return False
    return not (word.isdigit() and len(before) == 1)  # "1. Apples": an item number


def cut_sentences(text: str, final: bool) -> tuple[list[str], int]:
    """The complete sentences of `text` and where the undecided rest begins. final: nothing follows the
    text (its last sentence is complete); else a sentence is complete once its line break, or the
    character after its closing whitespace, has arrived. Sentences keep their inner spacing."""
    sentences: list[str] = []
    lines = text.split("\n")
    line_start = 0  # of the current line in text
    rest = 0
    for i, line in enumerate(lines):
        complete = final or i < len(lines) - 1  # a line break (or the end of everything) follows
        start = 0
        for match in _CANDIDATE.finditer(line):
            if match.end() == len(line):
                break  # the line's end: complete lines end their sentence anyway; else undecided
            if _ends_sentence(line, start, match, line[match.end()]):
                sentences.append(line[start:match.end()])
                start = match.end()
        if complete:
            sentences.append(line[start:])
            line_start += len(line) + 1
            rest = min(line_start, len(text))
        else:
            rest = line_start + start
    return [s for s in sentences if s.strip()], rest


def sentences_of(text: str) -> list[str]:
    """Whole input -> its sentences in order, whitespace collapsed."""
    return [" ".join(s.split()) for s in cut_sentences(text, final=True)[0]]


class SentenceStream:
    """Text arriving piece by piece -> each sentence as soon as it is complete, cut where `sentences_of`
    cuts the whole text.

    `push` returns the sentences a piece completed; `take_words` gives up waiting for a sentence's end and
    returns the complete words pending (up to the last soft break, a comma or dash, when there is one);
    `finish` returns the rest once no more text comes."""

    def __init__(self) -> None:
        self._pending = ""

    @property
    def pending(self) -> str:
        return self._pending

    def push(self, piece: str) -> list[str]:
        self._pending += piece
        done, rest = cut_sentences(self._pending, final=False)
        self._pending = self._pending[rest:]
        return [" ".join(s.split()) for s in done]

    def take_words(self) -> str | None:
        """The pending complete words (those followed by whitespace), cut at the last soft break among them
        when there is one; None when no word is complete yet."""
        spaces = [m.end() for m in re.finditer(r"\s+", self._pending) if m.start() > 0]
        if not spaces or not self._pending[:spaces[-1]].strip():
            return None
        breaks = [m.end() for m in _SOFT_BREAK.finditer(self._pending[:spaces[-1]])]
        cut = breaks[-1] if breaks else spaces[-1]
        taken, self._pending = self._pending[:cut], self._pending[cut:]
        return " ".join(taken.split())

    def finish(self) -> list[str]:
        done, _ = cut_sentences(self._pending, final=True)
        self._pending = ""
        return [" ".join(s.split()) for s in done]


def split_long(sentence: str, max_chars: int) -> list[str]:
    """A sentence -> pieces of at most max_chars: cut at commas/dashes, else at spaces, tiny fragments
    re-joined with their neighbour. Shorter sentences stay whole."""
    if len(sentence) <= max_chars:
        return [sentence]
    out: list[str] = []
    for part in _SOFT_BREAK.split(sentence):
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
    """Whole input -> speakable segments in order, each at most max_chars long; short sentences are merged
    ("Hi. Yes." is one segment). For families without a splitter of their own."""
    segments: list[str] = []
    for sentence in sentences_of(text):
        for piece in split_long(sentence, max_chars):
            if segments and len(segments[-1]) + 1 + len(piece) <= max_chars // 3:
                segments[-1] = f"{segments[-1]} {piece}"
            else:
                segments.append(piece)
    return segments
