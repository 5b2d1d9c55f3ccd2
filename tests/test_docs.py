"""The README and the model card read as documentation for users: the quick start gives what a new user
needs in order, and no internal milestone labels or pointers to notes users cannot see."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
# Internal milestone labels ("stop 9", "stop 8's") and pointers to notes outside the repository.
DIARY = re.compile(r"\bstop \d+\b|\bissues?'? notes\b|\bsee the notes\b", re.IGNORECASE)


def sections(markdown: str) -> dict[str, str]:
    """'## heading' -> the text under it."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_quick_start_gives_the_basics_in_order():
    quick = sections((ROOT / "README.md").read_text())["Quick start"]
    steps = ["Requirements", "Python 3.11", "disk", "The two commands", "make serve", "make test",
             "What to open", "playground", "/docs", "port", "stop", "sounds like", "ffplay", "aplay"]
    at = 0
    for step in steps:  # each one after the one before
        found = quick.find(step, at)
        assert found >= 0, f"{step!r} missing from the quick start, or out of order"
        at = found + len(step)


def test_docs_have_no_milestone_labels_or_private_notes():
    readme = sections((ROOT / "README.md").read_text())
    checked = dict(readme)
    checked["model card"] = (ROOT / "models" / "demo-en" / "README.md").read_text()
    found = {where: DIARY.findall(text) for where, text in checked.items() if DIARY.search(text)}
    assert found == {}
