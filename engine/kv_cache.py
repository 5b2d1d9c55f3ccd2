"""The physical KV cache of one model: all layers' K and V for every block of the pool.

Layout per layer and per K/V: [num_slots, num_kv_heads, head_dim] with num_slots = (num_blocks + 1) *
block_size, i.e. block-major [num_blocks + 1, block_size, H_kv, D] viewed flat (the layout paged kernels
such as flash-attn's expect). The extra last block is scratch: padding tokens write there, and block
tables are padded with it, so no real sequence's K/V is ever touched by padding.
"""

from __future__ import annotations

import torch

from engine.model.config import LlamaConfig


class KVCache:
    def __init__(self, cfg: LlamaConfig, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks
        num_slots = (num_blocks + 1) * block_size
        # Zero-filled, not empty: masked-out keys still enter softmax(...) @ V with weight 0, and 0 * NaN
        # from uninitialised memory would poison the output.
        self.data = torch.zeros(cfg.num_layers, 2, num_slots, cfg.num_kv_heads, cfg.head_dim,
                                device=device, dtype=dtype)  # [L, 2, S, H_kv, D]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of layer i, each [S, H_kv, D]."""
        return self.data[i, 0], self.data[i, 1]

    @property
    def num_bytes(self) -> int:
        return self.data.numel() * self.data.element_size()
