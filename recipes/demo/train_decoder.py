"""Fit the demo codec's conv decoder (codes -> log-mel) by L1 against the corpus's real log-mel frames."""

from __future__ import annotations

import time

import numpy as np
import torch
from pcgtts.engine.codec.demo.decoder import CodeToMel
from pcgtts.engine.codec.demo.features import LOG_FLOOR
from pcgtts.recipes.demo.optim import optimizer_step, warmup_linear_decay

DECODER_KWARGS = {"hidden": 256, "layers": 4, "kernel": 5}  # 192x3 at 1,500 steps measured worse


def train_decoder(codebook: torch.Tensor, codes: list[np.ndarray], mels: list[np.ndarray],
                  steps: int = 4000, batch: int = 16, window: int = 64, lr: float = 2e-3,
                  seed: int = 0, kwargs: dict | None = None) -> CodeToMel:
    """codes[i] int [T_i] and mels[i] [T_i, n_mels] (corpus log-mel) -> fitted decoder."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    floor = float(np.log(LOG_FLOOR))
    long_enough = [i for i, c in enumerate(codes) if len(c) >= window]
    model = CodeToMel(codebook, **(kwargs or DECODER_KWARGS))
    optim = torch.optim.AdamW([p for n, p in model.named_parameters() if n != "codebook"], lr=lr)
    start = time.time()
    for step in range(steps):
        xs, ys = [], []
        for i in rng.choice(long_enough, batch):
            off = int(rng.integers(0, len(codes[i]) - window + 1))
            xs.append(torch.from_numpy(codes[i][off:off + window].astype(np.int64)))
            ys.append(torch.from_numpy(mels[i][off:off + window].astype(np.float32)).clamp(min=floor))
        x, y = torch.stack(xs), torch.stack(ys)  # [B, W], [B, W, n_mels]
        loss = (model(x) - y).abs().mean()
        optimizer_step(optim, loss, warmup_linear_decay(step, steps, lr, warmup=100))
        if (step + 1) % 100 == 0:
            print(f"[decoder] step {step + 1}/{steps} L1 {loss.item():.4f} {time.time() - start:.0f}s",
                  flush=True)
    return model.eval()


def decoder_l1(decoder: torch.nn.Module, codes: list[np.ndarray], mels: list[np.ndarray]) -> float:
    """Mean L1 between decoded and real (floored) log-mel, over utterances."""
    floor = float(np.log(LOG_FLOOR))
    with torch.no_grad():
        err = [(decoder(torch.from_numpy(c.astype(np.int64))[None])[0]
                - torch.from_numpy(m.astype(np.float32)).clamp(min=floor)).abs().mean().item()
               for c, m in zip(codes, mels, strict=True)]
    return float(np.mean(err))
