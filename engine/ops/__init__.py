"""The engine's per-step operations that have a compiled CPU twin, each in one module with both forms.

    softmax_draw.py   temperature softmax and one inverse-CDF draw per row (each draft proposal)
    marker_merge.py   the demo family's marker-merge decode constraint (engine/speech/demo/constraint.py)
    verify.py         the verify of one speculation round: coarse (PCG, over ASG groups), exact (tokens),
                      block verification (block)
    rope_kv.py        a layer's q and k rotated, its new K/V into the pool's and the KV mirror's slots
    rms_norm.py       RMSNorm of each row (the CPU forwards' norms)
    row_attention.py  causal attention of each row over its own keys (the CPU forwards' attention; the
                      model runner decides where it runs, engine/model_runner.py `rows_attend`)

Each operation is a `Twin`: its `torch` form (tensor ops: any device and dtype; what CUDA runs) and its
`compiled` form (one numba loop per call over CPU tensors: at small vocabularies a decoding step between
forwards pays per torch op, not per element), with one signature, giving the same results from the same
inputs up to float rounding (tests/engine/test_ops.py runs both on the same inputs). Randomness enters as
uniforms the caller draws and passes in, so both forms draw the same tokens.

Which form runs is chosen in one place, `Ops.choose`: an engine calls it once at start-up
(`EngineConfig.compiled_cpu_ops`) and hands the result to everything that runs these operations; callers
without an engine (a rule or a constraint used on its own) call it for their tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# The compiled loops walk each row serially, O(V) per row: up to this vocabulary they beat the torch ops;
# larger vocabularies (Llasa's 65,536 codes and more) keep the vectorised, threaded torch ops.
COMPILED_MAX_V = 16384


@dataclass(frozen=True)
class Twin:
    """One operation in its two forms, with the same signature."""

    torch: Callable
    compiled: Callable


@dataclass(frozen=True)
class Ops:
    """Which form of every per-step operation runs."""

    compiled: bool

    @classmethod
    def choose(cls, device: torch.device | str, vocab_size: int, enabled: bool = True) -> Ops:
        """The compiled forms where they apply (tensors on the CPU, at most COMPILED_MAX_V tokens) and are
        enabled; the torch forms otherwise."""
        return cls(enabled and torch.device(device).type == "cpu" and vocab_size <= COMPILED_MAX_V)

    @classmethod
    def given_or_for(cls, ops: Ops | None, tensor: torch.Tensor) -> Ops:
        """`ops` if given (an engine's choice), else the choice for `tensor` ([..., V], on its device)."""
        return ops if ops is not None else cls.choose(tensor.device, tensor.shape[-1])

    def form(self, op: Twin) -> Callable:
        return op.compiled if self.compiled else op.torch


TORCH_OPS = Ops(compiled=False)
