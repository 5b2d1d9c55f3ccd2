"""Distinct English sentences for the demo corpus, from permissively licensed Debian text packages.

Sources (installed by `ensure_text_packages`): WordNet 3.0's example sentences and glosses
(`wordnet-base`, WordNet licence), the King James Bible (`bible-kjv`, public domain) and fortune cookies
(`fortunes`, `fortunes-min`). Text is cut at clause punctuation into pieces of a speakable length, reduced
to plain ASCII, deduplicated case-insensitively and shuffled with a fixed seed.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

DEBIAN_PACKAGES = ["wordnet-base", "bible-kjv", "bible-kjv-text", "fortunes", "fortunes-min"]
WORDNET_DIR = Path("/usr/share/wordnet")
FORTUNE_DIR = Path("/usr/share/games/fortunes")

MIN_WORDS, MAX_WORDS = 4, 14
_ALLOWED = re.compile(r"^[A-Za-z][A-Za-z ,.;:?!'-]*$")


def ensure_text_packages() -> None:
    """apt-get the text packages if their files are missing (needs root, as in the CI image)."""
    if WORDNET_DIR.exists() and FORTUNE_DIR.exists() and shutil.which("bible"):
        return
    prefix = [] if _is_root() else ["sudo"]
    subprocess.run(prefix + ["apt-get", "update", "-qq"], check=True)
    subprocess.run(prefix + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *DEBIAN_PACKAGES],
                   check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def _is_root() -> bool:
    return os.geteuid() == 0


def _wordnet_texts() -> Iterator[str]:
    for part in ("noun", "verb", "adj", "adv"):
        for line in (WORDNET_DIR / f"data.{part}").read_text(errors="replace").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue  # licence header
            gloss = line.split("|", 1)[1]
            examples = re.findall(r'"([^"]+)"', gloss)
            yield from examples
            definition = re.sub(r'"[^"]*"', "", gloss).strip(" ;")
            if definition:
                yield definition[0].upper() + definition[1:] + "."


def _kjv_texts() -> Iterator[str]:
    out = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        parts = line.split(" ", 1)
        if len(parts) == 2:
            yield parts[1]


def _fortune_texts() -> Iterator[str]:
    for path in sorted(FORTUNE_DIR.glob("*.u8")):
        if path.stem in {"ascii-art", "art", "perl", "linux", "computers", "debian"}:
            continue  # code, art and jargon speak badly
        for cookie in path.read_text(errors="replace").split("\n%\n"):
            lines = [s.strip() for s in cookie.splitlines() if s.strip() and not s.strip().startswith("--")]
            yield " ".join(lines)


def _pieces(text: str) -> Iterator[str]:
    """Cut a text into clauses of MIN_WORDS..MAX_WORDS words that end in punctuation."""
    text = re.sub(r"\s+", " ", text.replace("`", "'")).strip()
    for sentence in re.split(r"(?<=[.?!;:])\s+", text):
        words = sentence.split()
        if len(words) <= MAX_WORDS:
            yield sentence
            continue
        piece: list[str] = []
        for word in words:  # long sentence: cut at commas
            piece.append(word)
            if word.endswith(",") and len(piece) >= MIN_WORDS:
                yield " ".join(piece)[:-1] + "."
                piece = []
        if piece:
            yield " ".join(piece)


def _clean(piece: str) -> str | None:
    piece = piece.strip(" ,;:-'")
    words = piece.split()
    if not (MIN_WORDS <= len(words) <= MAX_WORDS) or not _ALLOWED.match(piece):
        return None
    if piece[-1] not in ".?!":
        piece = piece.rstrip(",;:") + "."
    return piece[0].upper() + piece[1:]


def collect_sentences(seed: int = 0) -> list[str]:
    """All distinct usable sentences, shuffled deterministically (same packages -> same list)."""
    seen: set[str] = set()
    sentences: list[str] = []
    for source in (_wordnet_texts(), _kjv_texts(), _fortune_texts()):
        for text in source:
            for piece in _pieces(text):
                clean = _clean(piece)
                if clean is None:
                    continue
                key = re.sub(r"[^a-z ]", "", clean.lower())
                if key not in seen:
                    seen.add(key)
                    sentences.append(clean)
    sentences.sort()  # independent of source iteration details, then a seeded shuffle
    random.Random(seed).shuffle(sentences)
    return sentences
