"""Temperature softmax and one inverse-CDF draw per row as one compiled CPU loop (numba).

A draft step at batch 1 needs probs = softmax(logits / T) (kept for verification) and one token drawn from
them; as torch ops that is a division, a softmax, a copy into the draft's probability buffer and the
sampler's cumulative sum, scaling, search and bounds check: ~8 ops, each 5-15 µs on this CPU right after a
forward (caches cold), for ~1,200 numbers. This loop does it in one pass per row, with the same uniform and
the same search as `engine.acceptance.sampling.sample_rows` over the same float32 probabilities, so a seed
draws the same token up to float rounding of the softmax itself.
"""

from __future__ import annotations

import math

from pcgtts.engine.cpu_kernel import cpu_kernel, draw_index


# explicit signature: compiled at import (or loaded from numba's disk cache); "[:, :]" takes strided rows
@cpu_kernel("void(float32[:, :], float32[::1], float64[::1], float32[:, :], int64[::1])")
def softmax_draw_cpu(logits, temperature, u, probs, tokens):
    """probs[b] = softmax(logits[b] / temperature[b]) (float32), tokens[b] = draw_index(probs[b], u[b]).
    logits, probs Float32[B, V]; temperature Float32[B]; u Float64[B]; tokens Long[B]."""
    rows, vocab = logits.shape
    for b in range(rows):
        t = temperature[b]
        top = -math.inf
        for j in range(vocab):
            top = max(top, logits[b, j] / t)
        total = 0.0
        for j in range(vocab):
            e = math.exp(logits[b, j] / t - top)
            probs[b, j] = e
            total += e
        for j in range(vocab):
            probs[b, j] = probs[b, j] / total
        tokens[b] = draw_index(probs[b], u[b])
