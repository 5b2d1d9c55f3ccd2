"""Shared helpers for the statistical tests of engine.acceptance (not a test module itself)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

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


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value of integer samples against probs [V].

    Bins expecting fewer than 5 samples are merged into one."""
    probs = probs.double().numpy()
    counts = np.bincount(samples.numpy(), minlength=probs.shape[0]).astype(np.float64)
    expected = probs * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        assert obs[-1] == 0, "samples fell on zero-probability outcomes"
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp).pvalue)


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
