"""The marker merge of the demo family's decode constraint (MarkerMergeConstraint), over N rows of logits.

    out = form(flat [N, V], merge_cols Long[M], closed Bool[V], targets, forced, held)

Per row r: the closed columns (every column if forced[r]) masked to the dtype's lowest value, then
out[r, targets[r]] = the log-sum-exp of flat[r, merge_cols] (0 if forced[r]: only the target may follow;
the lowest value if held[r]: the target may not follow yet). merge_cols: the marker columns and <end>;
closed: those and the specials that never occur in generated speech; targets (ints), forced and held
(bools): one per row, from the constraint's plan. The torch form is a fixed number of tensor ops whatever
N; the compiled form one pass per row (the log-sum-exp in float64, stored as float32).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pcgtts.engine.ops import Twin
from pcgtts.engine.ops.kernel import cpu_kernel


# an explicit signature compiles at import (or loads numba's disk cache), not on the first request
@cpu_kernel("void(float32[:, ::1], int64[::1], boolean[::1], int64[::1], boolean[::1], boolean[::1], "
            "float64, float32[:, ::1])")
def _merge_markers_rows(flat, merge_cols, closed, targets, forced, held, neg_inf, out):
    n, v = flat.shape
    for r in range(n):
        top = -math.inf
        for c in merge_cols:
            top = max(top, flat[r, c])
        merged = -math.inf
        if top > -math.inf:
            total = 0.0
            for c in merge_cols:
                total += math.exp(np.float64(flat[r, c]) - top)
            merged = top + math.log(total)
        for t in range(v):
            out[r, t] = neg_inf if forced[r] or closed[t] else flat[r, t]
        out[r, targets[r]] = 0.0 if forced[r] else (neg_inf if held[r] else merged)


def merge_markers_torch(flat: torch.Tensor, merge_cols: torch.Tensor, closed: torch.Tensor,
                        targets: list[int], forced: list[bool], held: list[bool]) -> torch.Tensor:
    neg_inf = torch.finfo(flat.dtype).min
    # over the marker columns only (M of V): the same sum as masking the rest to -inf, at M/V the cost
    merged = torch.logsumexp(flat.index_select(1, merge_cols), dim=-1, keepdim=True).to(flat.dtype)
    if any(forced) or any(held):  # rare (a phoneme at its cap or under its minimum): two more masks
        forced_rows = torch.tensor(forced, device=flat.device)[:, None]  # Bool[N, 1]
        out = flat.masked_fill(closed | forced_rows, neg_inf)
        held_rows = torch.tensor(held, device=flat.device)[:, None]
        merged = merged.masked_fill(forced_rows, 0.0).masked_fill_(held_rows, neg_inf)
    else:
        out = flat.masked_fill(closed, neg_inf)
    # the merged mass onto each position's expected marker: [N, V]
    return out.scatter_(1, torch.tensor(targets, device=flat.device)[:, None], merged)


def merge_markers_compiled(flat: torch.Tensor, merge_cols: torch.Tensor, closed: torch.Tensor,
                           targets: list[int], forced: list[bool], held: list[bool]) -> torch.Tensor:
    rows = flat.float().contiguous()
    out = torch.empty_like(rows)
    _merge_markers_rows(rows.numpy(), merge_cols.numpy(), closed.numpy(), np.array(targets, dtype=np.int64),
                        np.array(forced, dtype=bool), np.array(held, dtype=bool), torch.finfo(flat.dtype).min,
                        out.numpy())
    return out.to(flat.dtype)


MARKER_MERGE = Twin(torch=merge_markers_torch, compiled=merge_markers_compiled)
