"""Codes -> log-mel for the demo codec: a codebook lookup refined by a small non-causal conv net.

The net sees `context` frames either side of each frame, so it smooths the steps between k-means
centroids and undoes part of the quantisation error. Its weights are fitted by the recipe (L1 against
the real log-mel); with no weights the decoder is the plain centroid lookup.
"""

from __future__ import annotations

import torch
from torch import nn


class CodeToMel(nn.Module):
    def __init__(self, codebook: torch.Tensor, hidden: int = 256, layers: int = 3, kernel: int = 5):
        super().__init__()
        self.register_buffer("codebook", codebook.clone())  # [K, n_mels] k-means centroids
        n_mels = codebook.shape[1]
        self.inp = nn.Conv1d(n_mels, hidden, 1)
        self.convs = nn.ModuleList(nn.Conv1d(hidden, hidden, kernel, padding=kernel // 2)
                                   for _ in range(layers))
        self.out = nn.Conv1d(hidden, n_mels, 1)
        nn.init.zeros_(self.out.weight)  # starts as the centroid lookup
        nn.init.zeros_(self.out.bias)
        self.context = layers * (kernel // 2)  # frames of context needed on each side

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        # codes: [B, T] -> log-mel [B, T, n_mels]
        base = self.codebook[codes].transpose(1, 2)  # [B, n_mels, T]
        h = self.inp(base)
        for conv in self.convs:
            h = h + torch.nn.functional.gelu(conv(h))
        return (base + self.out(h)).transpose(1, 2)


class CentroidLookup(nn.Module):
    """The decoder without a net: each code's centroid."""

    context = 0

    def __init__(self, codebook: torch.Tensor):
        super().__init__()
        self.register_buffer("codebook", codebook.clone())

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.codebook[codes]
