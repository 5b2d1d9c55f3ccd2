"""A layer's fused q/k/v projection rotated and its new K/V written: RoPE on q and k, k and v into their pool
slots and, where the rows are mirrored, their KV-mirror slots; returns the rotated queries.

    q = form(qkv [N, (H + 2 H_kv) D], rope, positions Long[N], heads, kv_heads,
             pool_k [S, H_kv, D], pool_v, pool_slots Long[N],
             mirror_k [S', H_kv, D] | None, mirror_v | None, mirror_slots Long[N] | None)  ->  q [N, H, D]

qkv is the projection's float32 output, its q and k heads in interleaved-pair order (rope.py: each pair
(x_2i, x_2i+1) rotated by position · θ_i as the complex product x · e^{iθ}); rope is the model's
RotaryEmbedding (interleaved). A store is float32, or fp16 (rounded to nearest even as it is written, what
`Tensor.to(torch.float16)` does). Padding tokens carry position 0 and scratch slots.

Why compiled: per layer the torch form is half a dozen ops for the rotation (views to complex, the
product, views back, the split, a copy of q for the attention loop) and four `index_put_` calls each with a
dtype conversion, where the numbers are a few thousand multiply-adds: on the 2-core build machines a batch-16
decode forward took about an eighth less time with the loop. The loop computes each pair as the complex
product does (x_r·c − x_i·s, x_r·s + x_i·c, each product rounded, no fused multiply-add): the same bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from pcgtts.engine.kv_cache import write_kv
from pcgtts.engine.ops import Twin
from pcgtts.engine.ops.kernel import cpu_kernel, stored_as

if TYPE_CHECKING:
    from pcgtts.engine.model.rope import RotaryEmbedding

_NO_SLOTS = np.zeros(0, np.int64)


def write_new_kv(k: torch.Tensor, v: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor,
                 pool_slots: torch.Tensor, mirror_k: torch.Tensor | None = None,
                 mirror_v: torch.Tensor | None = None, mirror_slots: torch.Tensor | None = None) -> None:
    """k, v [N, H_kv, D] into the pool's slots and, given mirror slots, the mirror's (torch ops)."""
    n = k.shape[0]
    k, v = k.view(n, 1, *k.shape[1:]), v.view(n, 1, *v.shape[1:])
    write_kv(pool_k, pool_v, k, v, pool_slots)
    if mirror_slots is not None:
        write_kv(mirror_k, mirror_v, k, v, mirror_slots)


def rope_kv_torch(qkv: torch.Tensor, rope: RotaryEmbedding, positions: torch.Tensor, heads: int,
                  kv_heads: int, pool_k: torch.Tensor, pool_v: torch.Tensor, pool_slots: torch.Tensor,
                  mirror_k: torch.Tensor | None = None, mirror_v: torch.Tensor | None = None,
                  mirror_slots: torch.Tensor | None = None) -> torch.Tensor:
    n, dim = qkv.shape[0], pool_k.shape[-1]
    qk = qkv[:, :(heads + kv_heads) * dim].view(n, 1, heads + kv_heads, dim)
    rotated = rope.rotate(qk, rope.lookup(positions.view(n, 1))).view(n, heads + kv_heads, dim)
    q, k = rotated.split([heads, kv_heads], dim=1)
    write_new_kv(k, qkv[:, (heads + kv_heads) * dim:].view(n, kv_heads, dim), pool_k, pool_v, pool_slots,
                 mirror_k, mirror_v, mirror_slots)
    return q


def _signature(store: str) -> str:
    return (f"void(float32[:, ::1], float32[:, :, ::1], int64[:], int64, int64, {store}[:, :, ::1], "
            f"{store}[:, :, ::1], int64[:], {store}[:, :, ::1], {store}[:, :, ::1], int64[:], "
            "float32[:, :, ::1])")


@cpu_kernel([_signature("float32"), _signature("uint16")])
def _rope_kv_rows(qkv, cis, positions, heads, kv_heads, pool_k, pool_v, pool_slots, mirror_k, mirror_v,
                  mirror_slots, q):
    n = qkv.shape[0]
    dim = q.shape[2]
    mirrored = mirror_slots.shape[0] > 0
    for i in range(n):
        p, s = positions[i], pool_slots[i]
        m = mirror_slots[i] if mirrored else 0
        for h in range(heads + kv_heads):
            base = h * dim
            for j in range(dim // 2):
                x_r, x_i = qkv[i, base + 2 * j], qkv[i, base + 2 * j + 1]
                c, si = cis[p, j, 0], cis[p, j, 1]
                y_r = x_r * c - x_i * si
                y_i = x_r * si + x_i * c
                if h < heads:
                    q[i, h, 2 * j] = y_r
                    q[i, h, 2 * j + 1] = y_i
                else:
                    kh = h - heads
                    k_r, k_i = stored_as(y_r, pool_k), stored_as(y_i, pool_k)
                    pool_k[s, kh, 2 * j] = k_r
                    pool_k[s, kh, 2 * j + 1] = k_i
                    if mirrored:
                        mirror_k[m, kh, 2 * j] = k_r
                        mirror_k[m, kh, 2 * j + 1] = k_i
        base = (heads + kv_heads) * dim
        for kh in range(kv_heads):
            for d in range(dim):
                x = stored_as(qkv[i, base + kh * dim + d], pool_v)
                pool_v[s, kh, d] = x
                if mirrored:
                    mirror_v[m, kh, d] = x


def _store_view(t: torch.Tensor) -> np.ndarray:
    """A K/V store as the loop writes it: float32, or fp16 as its bits (uint16)."""
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.float16 else t.numpy()


def rope_kv_compiled(qkv: torch.Tensor, rope: RotaryEmbedding, positions: torch.Tensor, heads: int,
                     kv_heads: int, pool_k: torch.Tensor, pool_v: torch.Tensor, pool_slots: torch.Tensor,
                     mirror_k: torch.Tensor | None = None, mirror_v: torch.Tensor | None = None,
                     mirror_slots: torch.Tensor | None = None) -> torch.Tensor:
    q = torch.empty(qkv.shape[0], heads, pool_k.shape[-1], dtype=torch.float32)
    if mirror_slots is None:
        mirror_k, mirror_v, slots = pool_k, pool_v, _NO_SLOTS
    else:
        slots = mirror_slots.numpy()
    _rope_kv_rows(qkv.numpy(), rope.cis_pairs.numpy(), positions.numpy(), heads, kv_heads,
                  _store_view(pool_k), _store_view(pool_v), pool_slots.numpy(), _store_view(mirror_k),
                  _store_view(mirror_v), slots, q.numpy())
    return q


ROPE_KV = Twin(torch=rope_kv_torch, compiled=rope_kv_compiled)
