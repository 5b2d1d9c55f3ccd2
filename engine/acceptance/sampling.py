"""Batched categorical sampling driven only by an explicit torch.Generator.

Inverse-CDF sampling: one uniform per row and one cumulative sum, so a seed reproduces the draw and a
zero-probability token can never be returned (searchsorted(right=True) lands on a strictly rising step).
"""

from __future__ import annotations

import torch


def uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """U[0, 1) float64 samples of `shape` on `device` (float64 so that u * total never rounds up to total)."""
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float64)


def sample_rows(
    weights: torch.Tensor, generator: torch.Generator | None, u: torch.Tensor | None = None
) -> torch.Tensor:
    """One index per row of unnormalised nonnegative `weights` [R, V] -> Long[R].

    Rows whose weights are all zero return index 0 (callers make sure this never matters)."""
    cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)  # [R, V]
    if u is None:
        u = uniform((weights.shape[0],), generator, weights.device)
    target = (u * cdf[:, -1]).unsqueeze(-1)  # [R, 1]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp_(max=weights.shape[-1] - 1)


def sample_segments(
    weights: torch.Tensor,
    indptr: torch.Tensor,
    generator: torch.Generator | None,
    u: torch.Tensor | None = None,
) -> torch.Tensor:
    """One position per segment of a ragged array: segment r is weights[indptr[r]:indptr[r+1]].

    weights: [L] nonnegative; indptr: Long[R+1]; returns Long[R] absolute positions into `weights`.
    Every segment must be non-empty with a positive total."""
    cdf = torch.cumsum(weights, dim=0, dtype=torch.float64)  # [L]
    cdf0 = torch.cat([cdf.new_zeros(1), cdf])  # cdf0[i] = sum(weights[:i])
    start, end = cdf0[indptr[:-1]], cdf0[indptr[1:]]
    if u is None:
        u = uniform((start.shape[0],), generator, weights.device)
    target = start + u * (end - start)
    pos = torch.searchsorted(cdf, target, right=True)
    return torch.minimum(pos, indptr[1:] - 1)
