"""The physical KV cache of one model: all layers' K and V for every block of the pool.

Layout per layer and per K/V: [num_slots, num_kv_heads, head_dim] with num_slots = (num_blocks + 1) *
block_size, i.e. block-major [num_blocks + 1, block_size, H_kv, D] viewed flat (the layout paged kernels
such as flash-attn's expect). The extra last block is scratch: padding tokens write there, and block
tables are padded with it, so no real sequence's K/V is ever touched by padding.

Each layer's K and each layer's V is its own allocation (not a view of one big tensor): a captured graph
(torch.compile) that writes new K/V in place into a view of a larger input would copy the whole input.
"""

from __future__ import annotations

import torch
from pcgtts.engine.model.config import LlamaConfig


class KVCache:
    def __init__(self, cfg: LlamaConfig, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_block = num_blocks
        num_slots = (num_blocks + 1) * block_size
        # Zero-filled, not empty: masked-out keys still enter softmax(...) @ V with weight 0, and 0 * NaN
        # from uninitialised memory would poison the output.
        shape = (num_slots, cfg.num_kv_heads, cfg.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of layer i, each [S, H_kv, D]."""
        return self.keys[i], self.values[i]

    def tensors(self) -> list[torch.Tensor]:
        """Every K and V tensor, layer by layer."""
        return [t for pair in zip(self.keys, self.values, strict=True) for t in pair]

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """New k/v [B, T, H_kv, D] into their slots (caches [S, H_kv, D]). `index_put_` rather than
    `index_copy_`: inductor turns it into an in-place scatter instead of copying the whole cache."""
    b, t, h_kv, d = k.shape
    k_cache.index_put_((slot_mapping,), k.reshape(b * t, h_kv, d).to(k_cache.dtype))
    v_cache.index_put_((slot_mapping,), v.reshape(b * t, h_kv, d).to(v_cache.dtype))
