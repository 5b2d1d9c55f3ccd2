"""Rotary position embeddings, incl. Llama-3 frequency scaling, in one of two equivalent forms.

Llama checkpoints rotate dimension j of each q/k head with dimension j + D/2 ("rotate half"). Attention only
needs q·k, which is unchanged when q and k permute their dimensions alike, so the loader may reorder each q/k
head to interleaved pairs (j, j + D/2) -> (2j, 2j + 1) (`interleave_rope_rows`) and rotate each pair as one
complex number: a single complex multiply per forward and layer instead of slicing, negating, concatenating
and three arithmetic passes. On CPU with float32 weights that saves ~5 small ops per layer, which is what a
decode forward of a small model pays for (the loader's `few_op_forms`); elsewhere the checkpoint's own form
is kept: bf16/fp16 have no complex type to match, CUDA graphs and inductor fuse the real ops anyway (and
inductor has no complex code generation).
"""

from __future__ import annotations

import math

import torch


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Float32 [head_dim / 2] rotation frequencies, scaled as the checkpoint's rope_scaling says."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    kind = scaling["rope_type"]
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    raise ValueError(f"unsupported rope_scaling type {kind!r}")


def _llama3_scaled(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between blended."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, scaled)


def interleave_rope_rows(weight: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Rows of a fused projection ([rows, ...]; a bias: [rows]) whose first `num_heads` heads are rotated
    (q and k), reordered within each of those heads from rotate-half order to interleaved pairs: new row
    2j = old j, 2j + 1 = old j + D/2. Rows after them (v) keep their place."""
    half = head_dim // 2
    order = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()  # [D]
    rotated = (torch.arange(num_heads)[:, None] * head_dim + order[None, :]).flatten()
    rows = torch.cat([rotated, torch.arange(num_heads * head_dim, weight.shape[0])]).to(weight.device)
    return weight.index_select(0, rows)


class RotaryEmbedding:
    """Rotation tables for positions [0, max_positions), looked up by position: cos/sin [P, D] for the
    rotate-half form, or with `interleaved` one complex table e^{i·angle} [P, D/2] for interleaved pairs."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_positions: int,
                 device: torch.device, dtype: torch.dtype, interleaved: bool = False):
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]  # [P, D/2]
        self.interleaved = interleaved
        if interleaved:
            self.cis = torch.polar(torch.ones_like(freqs), freqs).to(device)  # complex64 [P, D/2]
            self.cis_pairs = torch.view_as_real(self.cis)  # the same as float32 [P, D/2, 2] (cos, sin)
        else:
            emb = torch.cat([freqs, freqs], dim=-1)  # [P, head_dim]
            self.cos = emb.cos().to(device=device, dtype=dtype)
            self.sin = emb.sin().to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """positions Long[B, T] -> the rotation of those positions for `rotate`, broadcast over heads:
        (cis [B, T, 1, D/2],) interleaved, else (cos, sin) [B, T, 1, D]."""
        if self.interleaved:
            return (self.cis[positions].unsqueeze(2),)
        return self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)

    def rotate(self, x: torch.Tensor, rotation: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """x [B, T, H, D] (a view is fine) rotated by `lookup`'s result -> a new [B, T, H, D] tensor."""
        if not self.interleaved:
            return apply_rotary(x, *rotation)
        b, t, h, d = x.shape
        pairs = torch.view_as_complex(x.unflatten(-1, (d // 2, 2)))  # [B, T, H, D/2] complex
        return torch.view_as_real(pairs * rotation[0]).view(b, t, h, d)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] rotated by cos/sin [B, T, 1, D] (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
