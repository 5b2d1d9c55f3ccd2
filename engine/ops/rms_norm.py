"""RMSNorm of each row, Hugging Face's formula: weight · x / sqrt(mean(x²) + eps), in float32.

    out = form(x [..., d], weight [d], eps)  ->  [..., d]

The torch form is torch's fused `rms_norm` for float32 (the formula bit for bit, tested) and the formula
op by op for other dtypes (normalised in float32, rounded back before the weight, as Hugging Face does).
The compiled form is one pass per row over float32 CPU rows, agreeing with it to float32 rounding (its sum of
squares is grouped as the vector width has it).

Why compiled: at decode sizes a norm is a few thousand multiply-adds, and torch's CPU call costs 30-40 µs
whatever the size on the 2-core build machines (`rms_norm` and the layer-norm form of it alike), 13 of them
per forward of the embedded model: about a tenth of a batch-16 decode forward. The loop costs a few µs.
And it is batch-invariant by construction: a row's numbers come from that row alone, in one order whatever
the row count, so a position computes the same bits in a prefill chunk and in a decode step
(engine/batch_invariance.py).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pcgtts.engine.ops import Twin
from pcgtts.engine.ops.kernel import REASSOCIATE, cpu_kernel


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # torch's fused op: the same numbers as the lines below (checked bit for bit in tests) in one call
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@cpu_kernel("void(float32[:, :], float32[::1], float32, float32[:, ::1])", fastmath=REASSOCIATE)
def _rms_norm_rows(x, weight, eps, out):
    rows, dim = x.shape
    for r in range(rows):
        total = np.float32(0.0)
        for j in range(dim):
            total += x[r, j] * x[r, j]
        scale = np.float32(1.0) / np.sqrt(total / np.float32(dim) + eps)
        for j in range(dim):
            out[r, j] = weight[j] * (x[r, j] * scale)


def rms_norm_compiled(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dim = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.float32)
    _rms_norm_rows(x.reshape(-1, dim).numpy(), weight.numpy(), np.float32(eps), out.view(-1, dim).numpy())
    return out


RMS_NORM = Twin(torch=rms_norm_torch, compiled=rms_norm_compiled)
