"""Temperature softmax and one inverse-CDF draw per row: each draft proposal's distribution and token.

    probs, tokens = form(logits [B, V], temperature Float32[B], u Float64[B], out=None)

probs = softmax(logits / T) in float32 (kept for verification; written into `out`, Float32[B, V], when
given), tokens Long[B] = the index `sample_rows` draws from probs with uniform u. The torch form is those
ops (a division, a softmax, a copy and the sampler's cumulative sum and search); the compiled form does the
same in one pass per row, with the same search over the same float32 probabilities, so one uniform draws
the same token up to float rounding of the softmax itself.
"""

from __future__ import annotations

import math

import torch
from pcgtts.engine.acceptance.sampling import sample_rows
from pcgtts.engine.ops import Twin
from pcgtts.engine.ops.kernel import cpu_kernel, draw_index


# explicit signature: compiled at import (or loaded from numba's disk cache); "[:, :]" takes strided rows
@cpu_kernel("void(float32[:, :], float32[::1], float64[::1], float32[:, :], int64[::1])")
def _softmax_draw_rows(logits, temperature, u, probs, tokens):
    """probs[b] = softmax(logits[b] / temperature[b]) (float32), tokens[b] = draw_index(probs[b], u[b])."""
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


def softmax_draw_torch(logits: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor,
                       out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits.float() / temperature[:, None], dim=-1)  # [B, V]
    if out is not None:
        probs = out.copy_(probs)
    return probs, sample_rows(probs, None, u)


def softmax_draw_compiled(logits: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor,
                          out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    b, v = logits.shape
    probs = out if out is not None else torch.empty(b, v)
    tokens = torch.empty(b, dtype=torch.long)
    _softmax_draw_rows(logits.float().numpy(), temperature.numpy(), u.numpy(), probs.numpy(), tokens.numpy())
    return probs, tokens


SOFTMAX_DRAW = Twin(torch=softmax_draw_torch, compiled=softmax_draw_compiled)
