"""The chi-square goodness-of-fit check the statistical tests share (acceptance rules, vLLM plugin)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats


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
