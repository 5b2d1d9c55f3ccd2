"""Causal attention of each row's queries over that row's own keys, read in place (the KV mirror or gathered
blocks): the CPU forwards' attention.

    out = form(q [B, T, H, D], keys [R, S, H_kv, D], values [R, S, H_kv, D], rows Long[B],
               positions Long[B, T], gaps Long[B, T, 2] | None)  ->  out [B, T, H, D]

Batch row b attends over keys[rows[b], :p + 1] for each query at position p = positions[b, t], less the
keys [lo, hi) of its gap (gaps[b, t]: a token tree's earlier branches, engine/attention.py TreeLayout); a
position of -1 marks a padding query (its output is zeros). Float32 on the CPU; keys and values float32 or
fp16 (an fp16 K/V store: the kernel widens each element as it reads it, so it computes what it would over
the float32 widening of those K/V, at half the memory traffic). A query with a gap sums over
its visible keys in the same order, with the same numbers, as a query without one over those keys laid out
contiguously: a tree branch computes the bits its tokens would as a chain.

Why a loop of its own: torch's CPU attention kernel runs over a context padded to the batch's longest row,
every row of the mirror's span (rows sitting a step out included), with a mask built per forward; on the
2-core build machines its decode-sized calls are far from the memory traffic they need. The compiled form
reads each row's keys once up to its own last position, no further. And it is batch-invariant by
construction: a query's numbers come from its own q, its own keys and its own position only (its sums run
over j <= p in one order whatever else the call holds), so a query computes the same bits in a decode
step, a verify step, a prefill chunk of any length, alone or beside any batch mates; no padding of contexts
or query blocks is needed (engine/batch_invariance.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from pcgtts.engine.batch_invariance import causal_mask
from pcgtts.engine.ops import Twin
from pcgtts.engine.ops.kernel import CACHE_LINE, REASSOCIATE, as_float32, cpu_kernel, prefetch

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)
# keys ahead of the one being scored whose K and V rows are asked for from memory (2-16 measured alike)
PREFETCH_KEYS = 8


@cpu_kernel("float32(float32[::1], float32, int64, int32[::1])", fastmath=REASSOCIATE)
def _exp_shifted(s, top, n, bits):
    """s[:n] <- exp(s[:n] - top) (each argument <= 0) -> their sum. Cephes' expf (2^k · e^r, a degree-5
    polynomial on |r| <= ln2/2; within 4 float32 epsilons, tested), written out so the loop vectorises;
    libm's expf is one call per element."""
    for j in range(n):
        x = max(s[j] - top, np.float32(-87.0))  # below this exp underflows float32
        k = np.floor(x * _LOG2E + np.float32(0.5))
        r = x - k * _LN2_HI - k * _LN2_LO
        p = np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        s[j] = p * (r * r) + r + np.float32(1.0)
        bits[j] = (np.int32(k) + np.int32(127)) << np.int32(23)  # 2^k as float32 bits
    powers = bits[:n].view(np.float32)
    total = np.float32(0.0)
    for j in range(n):
        e = s[j] * powers[j]
        s[j] = e
        total += e
    return total


def _signature(kv: str) -> str:
    return (f"void(float32[:, :, :, ::1], {kv}[:, :, :, ::1], {kv}[:, :, :, ::1], int64[::1], "
            "int64[:, ::1], int64[:, :, ::1], float32[:, :, :, ::1])")


# K/V float32, or fp16 viewed as uint16 (read through as_float32: half the bytes, the same float32 values)
@cpu_kernel([_signature("float32"), _signature("uint16")], fastmath=REASSOCIATE)
def _attend_rows(q, keys, values, rows, positions, gaps, out):
    b_rows, t_len, heads, dim = q.shape
    kv_heads = keys.shape[2]
    group = heads // kv_heads  # query heads per K/V head
    scale = np.float32(1.0 / math.sqrt(dim))
    longest = max(positions.max() + 1, 1)  # keys of the call's longest row
    scores = np.zeros((t_len, heads, longest), np.float32)
    visible = np.zeros(longest, np.float32)  # a gapped query's scores, its visible keys side by side
    bits = np.zeros(longest, np.int32)
    acc = np.zeros(dim, np.float32)
    key = np.zeros(dim, np.float32)
    row_bytes = keys.shape[2] * dim * keys.itemsize  # one position's K (or V), every K/V head
    for b in range(b_rows):
        r = rows[b]
        n = positions[b].max() + 1  # this row's keys (0 for a row of padding)
        # scores[t, h, j] = q·k / sqrt(D) for every key of the row (each key read once for all its queries)
        for j in range(n):
            if j + PREFETCH_KEYS < n:  # K/V rows ahead toward the caches (V is read once the scores are in)
                for line in range(0, row_bytes, CACHE_LINE):
                    prefetch(keys, r, j + PREFETCH_KEYS, line)
                    prefetch(values, r, j + PREFETCH_KEYS, line)
            for kv in range(kv_heads):  # not h // group per key: an integer division costs a few ns
                for d in range(dim):  # this key's K row widened once for all the queries that read it
                    key[d] = as_float32(keys[r, j, kv, d])
                for h in range(kv * group, (kv + 1) * group):
                    for t in range(t_len):
                        if positions[b, t] < j:  # a key past this query (half of a prefill chunk's pairs)
                            continue
                        dot = np.float32(0.0)
                        for d in range(dim):
                            dot += q[b, t, h, d] * key[d]
                        scores[t, h, j] = dot * scale
        for t in range(t_len):
            p = positions[b, t]
            lo, hi = gaps[b, t, 0], gaps[b, t, 1]
            skip = hi - lo if lo < hi else 0
            for h in range(heads):
                if p < 0:  # a padding query
                    for d in range(dim):
                        out[b, t, h, d] = 0.0
                    continue
                s = scores[t, h]
                if skip:  # keys [0, lo) then [hi, p]: one contiguous run, as a chain's would be
                    for j in range(lo):
                        visible[j] = s[j]
                    for j in range(hi, p + 1):
                        visible[j - skip] = s[j]
                    s = visible
                m = p + 1 - skip
                top = s[0]
                for j in range(1, m):
                    top = max(top, s[j])
                inv = np.float32(1.0) / _exp_shifted(s, top, m, bits)
                kv = h // group
                for d in range(dim):
                    acc[d] = 0.0
                # the visible keys in order: those before the gap at their own place, those after it `skip`
                # further on (two runs, so that the inner loop carries no choice of key)
                before = lo if skip else m
                for run in range(2):
                    start, stop, offset = (0, before, 0) if run == 0 else (before, m, skip)
                    for j in range(start, stop):
                        w = s[j] * inv
                        for d in range(dim):
                            acc[d] += w * as_float32(values[r, j + offset, kv, d])
                for d in range(dim):
                    out[b, t, h, d] = acc[d]


def _no_gaps(positions: torch.Tensor) -> torch.Tensor:
    return torch.zeros(*positions.shape, 2, dtype=torch.long)


def attend_rows_compiled(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor,
                         positions: torch.Tensor, gaps: torch.Tensor | None = None) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32)
    gaps = _no_gaps(positions) if gaps is None else gaps
    _attend_rows(q.contiguous().numpy(), _kernel_view(keys), _kernel_view(values), rows.numpy(),
                 positions.contiguous().numpy(), gaps.contiguous().numpy(), out.numpy())
    return out


def _kernel_view(kv: torch.Tensor) -> np.ndarray:
    """K or V as the kernel reads it: float32, or fp16 as its bits (uint16)."""
    return kv.view(torch.int16).numpy().view(np.uint16) if kv.dtype == torch.float16 else kv.numpy()


def attend_rows_torch(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor,
                      positions: torch.Tensor, gaps: torch.Tensor | None = None) -> torch.Tensor:
    """The same from torch ops: each row's keys selected, a causal mask (less the gaps) from the
    positions, SDPA."""
    longest = int(positions.max()) + 1 if positions.numel() else 1
    k, v = (t[rows, :max(longest, 1)].float() for t in (keys, values))  # [B, ctx, H_kv, D]
    visible = causal_mask(positions, k.shape[1], torch.bool, gaps)[:, 0]  # [B, T, ctx]
    visible[..., 0] |= positions < 0  # a padding query sees key 0 (its output is zeroed below)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=visible[:, None], enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2).masked_fill((positions < 0)[:, :, None, None], 0.0)


ROW_ATTENTION = Twin(torch=attend_rows_torch, compiled=attend_rows_compiled)
