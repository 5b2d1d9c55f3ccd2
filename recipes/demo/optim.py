"""The step every training loop of the recipe takes: set the learning rate, back-propagate, clip, update."""

from __future__ import annotations

import torch


def warmup_linear_decay(step: int, steps: int, peak: float, warmup: int, floor: float = 0.0) -> float:
    """Learning rate at `step` of `steps`: linear warm-up over `warmup` steps, then linear decay from `peak`
    towards 0, held at floor x peak."""
    return peak * min(1.0, (step + 1) / warmup) * max(floor, 1 - step / steps)


def optimizer_step(optim: torch.optim.Optimizer, loss: torch.Tensor, lr: float,
                   clip: float | None = None) -> None:
    """One update at learning rate `lr`; clip: max gradient norm over the optimiser's parameters (None:
    no clipping)."""
    for group in optim.param_groups:
        group["lr"] = lr
    optim.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_([p for g in optim.param_groups for p in g["params"]], clip)
    optim.step()
