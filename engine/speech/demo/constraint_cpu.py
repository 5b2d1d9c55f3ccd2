"""The marker merge of MarkerMergeConstraint as one compiled CPU loop (numba), for float32 logits on the CPU.

The torch-op version (`merge_markers_torch`, which CUDA and other dtypes run) costs ~8 small ops per call
(index_select, logsumexp, masked_fill, tensor, scatter, ...), 100-200 µs on this CPU, and the engine calls it
for every draft step and every verify: about a tenth of a batch-1 speculative step. This loop does the same
per row in a few microseconds: the log-sum-exp of the marker columns (in float64, stored as float32), the
closed columns masked, the merged mass written onto the row's target marker.
"""

from __future__ import annotations

import math

import numpy as np
from pcgtts.engine.cpu_kernel import cpu_kernel


# an explicit signature compiles at import (or loads numba's disk cache), not on the first request
@cpu_kernel("void(float32[:, ::1], int64[::1], boolean[::1], int64[::1], boolean[::1], boolean[::1], "
            "float64, float32[:, ::1])")
def merge_markers_cpu(flat, merge_cols, closed, targets, forced, held, neg_inf, out):
    """out[r] = flat[r] with closed columns (every column if forced[r]) at neg_inf, then out[r, targets[r]] =
    the log-sum-exp of flat[r, merge_cols] (0 if forced[r]: only the target may follow; neg_inf if held[r]:
    the target may not follow yet). flat, out Float32[N, V]; merge_cols Long[M]; closed Bool[V];
    targets Long[N]; forced, held Bool[N]."""
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
