"""Pseudo-speakers for the LM's training: vocal-tract-length warps applied in code space.

The LM clones the 56 speakers it trained on (95% in the cloning test with held-in speakers) far better than
unseen ones (72%): with so few voices it learns to recognise speakers rather than to copy what it hears in
the reference. Warping the frequency axis by a factor α (VTLP, Jaitly & Hinton 2013) moves formants and
harmonics as a longer or shorter vocal tract would, so each (speaker, α) pair sounds like another speaker.

Because the codec is a k-means codebook over log-mel frames, a warp is a lookup table: warp every centroid
and quantise it again. A training example warps its reference clip and its target speech by the same
table, so the model is shown that the voice to produce is the one in the reference.
"""

from __future__ import annotations

import numpy as np
import torch
from pcgtts.engine.codec.demo.features import MelSpec

# ±8%: measured on held-in speech through the codec, these move resemblyzer similarity to the unwarped
# voice from 0.90 to 0.81-0.86 (about as far apart as two espeak-ng variants) while Whisper WER stays
# within 0.31-0.53 (0.40 unwarped); ±15% costs intelligibility (WER 0.54-0.78).
WARP_FACTORS = (0.92, 0.94, 0.96, 0.98, 1.02, 1.04, 1.06, 1.08)


def warp_log_mel(log_mel: torch.Tensor, alpha: float, spec: MelSpec = MelSpec()) -> torch.Tensor:
    """[..., n_mels] -> the same frames as heard through a vocal tract scaled by 1/alpha: the energy at
    frequency f moves to alpha * f (band values interpolated; bands beyond the edges repeat the edge)."""
    centres = spec.band_edges[1:-1]
    source = np.interp(centres / alpha, centres, np.arange(spec.n_mels))  # fractional band read, [n_mels]
    lo = np.floor(source).astype(np.int64)
    hi = np.minimum(lo + 1, spec.n_mels - 1)
    w = torch.from_numpy((source - lo).astype(np.float32))
    return log_mel[..., lo] * (1 - w) + log_mel[..., hi] * w


def warp_code_maps(codec, factors: tuple[float, ...] = WARP_FACTORS) -> np.ndarray:
    """int64 [len(factors), codebook_size]: code c of a voice -> its code in the warped voice."""
    return np.stack([codec.quantize(warp_log_mel(codec.codebook, a)) for a in factors]).astype(np.int64)
