"""Shared helpers for the statistical tests of engine.acceptance (not a test module itself)."""

from __future__ import annotations

import numpy as np
import torch
from stats_support import chi2_pvalue  # noqa: F401 (the acceptance tests import it from here)

# Tests reject at this p-value; with the sample sizes used, a 1% (absolute) error gives p far below it.
ALPHA = 1e-4
# A z-score beyond this fails a mean check (two-sided p ~ 7e-6).
Z_MAX = 4.5


def random_dist(vocab: int, seed: int, concentration: float = 1.0) -> torch.Tensor:
    """A Dirichlet-distributed probability vector [V] (float64 for exact reference values)."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.dirichlet(np.full(vocab, concentration)))


def batch_of(dist: torch.Tensor, rows: int, positions: int) -> torch.Tensor:
    """The same distribution at every (row, position): a [rows, positions, V] float32 view."""
    return dist.float().expand(rows, positions, -1)


def sample_drafts(draft_probs: torch.Tensor, seed: int) -> torch.Tensor:
    """x ~ p at every (row, position) of draft_probs [B, γ, V] -> Long[B, γ]."""
    b, g, v = draft_probs.shape
    gen = torch.Generator().manual_seed(seed)
    flat = draft_probs.reshape(b * g, v)
    return torch.multinomial(flat, 1, replacement=True, generator=gen).view(b, g)


def perturbed(probs: torch.Tensor, amount: float = 0.01) -> torch.Tensor:
    """probs with `amount` of mass moved from its largest to its smallest entry (a 1% error to detect)."""
    out = probs.clone().double()
    out[out.argmax()] -= amount
    out[out.argmin()] += amount
    return out


def z_score(samples: torch.Tensor, expected_mean: float) -> float:
    """(sample mean - expected) / standard error, with the sample's own standard deviation."""
    x = samples.double()
    return float((x.mean() - expected_mean) / (x.std() / np.sqrt(x.numel())))
