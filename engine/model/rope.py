"""Rotary position embeddings (Llama's rotate-half convention), incl. Llama-3 frequency scaling."""

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


class RotaryEmbedding:
    """Cos/sin tables for positions [0, max_positions), looked up by position."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_positions: int,
                 device: torch.device, dtype: torch.dtype):
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)  # [P, head_dim]
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions Long[B, T] -> cos, sin [B, T, 1, head_dim] (broadcast over heads)."""
        return self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] rotated by cos/sin [B, T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
