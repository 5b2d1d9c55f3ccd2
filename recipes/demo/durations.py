"""Per-phoneme duration caps for the demo family's decode constraint, from the corpus's phoneme alignments.

A cap is a high percentile of how many frames that phoneme takes in the training utterances (all speakers,
both speaking rates). The percentile was chosen by free-running WER on held-out sentences
(models/demo-en/README.md): lower caps cut the stretched phonemes and loops, too low ones clip real ones.
"""

from __future__ import annotations

import numpy as np
from pcgtts.engine.speech.demo.layout import PHONEME_OFFSET, DemoVocab, phoneme_durations
from pcgtts.recipes.demo.lm_data import Utterances

CAP_PERCENTILE = 95.0


def phoneme_frames(utts: Utterances) -> dict[int, np.ndarray]:
    """phoneme id -> int [occurrences] frames each occurrence takes (as laid out by speech_tokens)."""
    frames: dict[int, list[int]] = {}
    for pids, starts, codes in zip(utts.phoneme_ids, utts.starts, utts.codes, strict=True):
        for pid, n in zip(pids, phoneme_durations(starts, len(codes)), strict=True):
            frames.setdefault(int(pid), []).append(int(n))
    return {pid: np.array(v) for pid, v in frames.items()}


def duration_caps(vocab: DemoVocab, utts: Utterances, percentile: float = CAP_PERCENTILE) -> dict[str, int]:
    """phoneme mnemonic -> most frames it may take when generating: the fewest frames that at least
    `percentile` % of its occurrences fit in."""
    return {vocab.phonemes[pid - PHONEME_OFFSET]: int(np.percentile(n, percentile, method="inverted_cdf"))
            for pid, n in sorted(phoneme_frames(utts).items())}
