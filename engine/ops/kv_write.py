"""A forward's new K/V written into their pool slots and, where the row is mirrored, its KV-mirror slots.

    form(k [N, H_kv, D], v [N, H_kv, D], pool_k [S, H_kv, D], pool_v, pool_slots Long[N],
         mirror_k [S', H_kv, D] | None, mirror_v | None, mirror_slots Long[N] | None)  ->  None

k and v are float32 views (rows may be strided, each row's [H_kv, D] contiguous: k sliced from the rotated
q/k heads, v from the fused projection); a store is float32, or fp16 (rounded to nearest even as it is
written, what `Tensor.to(torch.float16)` does). Padding tokens carry scratch slots in both.

Why compiled: per layer the torch form is four `index_put_` calls with a dtype conversion before each, about
140 µs of a decode layer's time at batch 16 on the 2-core build machines (as much as its qkv product) for a
few kilobytes of copying; the loop writes all four in one call. Both forms write the same bits.
"""

from __future__ import annotations

import numpy as np
import torch
from pcgtts.engine.kv_cache import write_kv
from pcgtts.engine.ops import Twin
from pcgtts.engine.ops.kernel import cpu_kernel, stored_as

_NO_SLOTS = np.zeros(0, np.int64)


def write_kv_torch(k: torch.Tensor, v: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor,
                   pool_slots: torch.Tensor, mirror_k: torch.Tensor | None = None,
                   mirror_v: torch.Tensor | None = None, mirror_slots: torch.Tensor | None = None) -> None:
    n = k.shape[0]
    write_kv(pool_k, pool_v, k.view(n, 1, *k.shape[1:]), v.view(n, 1, *v.shape[1:]), pool_slots)
    if mirror_slots is not None:
        write_kv(mirror_k, mirror_v, k.view(n, 1, *k.shape[1:]), v.view(n, 1, *v.shape[1:]), mirror_slots)


def _signature(store: str) -> str:
    return (f"void(float32[:, :, :], float32[:, :, :], {store}[:, :, ::1], {store}[:, :, ::1], int64[:], "
            f"{store}[:, :, ::1], {store}[:, :, ::1], int64[:])")


@cpu_kernel([_signature("float32"), _signature("uint16")])
def _write_kv_rows(k, v, pool_k, pool_v, pool_slots, mirror_k, mirror_v, mirror_slots):
    n, heads, dim = k.shape
    mirrored = mirror_slots.shape[0] > 0
    for i in range(n):
        s = pool_slots[i]
        m = mirror_slots[i] if mirrored else 0
        for h in range(heads):
            for d in range(dim):
                kx = stored_as(k[i, h, d], pool_k)
                vx = stored_as(v[i, h, d], pool_v)
                pool_k[s, h, d] = kx
                pool_v[s, h, d] = vx
                if mirrored:
                    mirror_k[m, h, d] = kx
                    mirror_v[m, h, d] = vx


def _store_view(t: torch.Tensor) -> np.ndarray:
    """A K/V store as the loop writes it: float32, or fp16 as its bits (uint16)."""
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.float16 else t.numpy()


def write_kv_compiled(k: torch.Tensor, v: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor,
                      pool_slots: torch.Tensor, mirror_k: torch.Tensor | None = None,
                      mirror_v: torch.Tensor | None = None, mirror_slots: torch.Tensor | None = None) -> None:
    if mirror_slots is None:
        mirror_k, mirror_v, slots = pool_k, pool_v, _NO_SLOTS
    else:
        slots = mirror_slots.numpy()
    _write_kv_rows(k.numpy(), v.numpy(), _store_view(pool_k), _store_view(pool_v), pool_slots.numpy(),
                   _store_view(mirror_k), _store_view(mirror_v), slots)


KV_WRITE = Twin(torch=write_kv_torch, compiled=write_kv_compiled)
