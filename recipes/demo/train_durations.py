"""Train the demo family's duration model (engine/speech/demo/durations.py) on the corpus's alignments.

Each example is one training utterance's phonemes with its frames per phoneme (as the layout lays them out)
and a reference clip of another utterance by the same speaker, drawn as the LM's training draws it, so the
model learns the speaker's rate from the same kind of prompt it gets when serving. Loss: MSE on
log(1 + frames).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from pcgtts.engine.speech.demo.durations import DurationConfig, DurationModel
from pcgtts.engine.speech.demo.layout import PHONEME_OFFSET, phoneme_durations
from pcgtts.recipes.demo.lm_data import Utterances, pick_reference, reference_clip
from pcgtts.recipes.demo.optim import optimizer_step, warmup_linear_decay


def duration_batch(utts: Utterances, rows, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """Padded tensors for utterances `rows`: phonemes/valid/log_frames [B, P], ref/ref_valid [B, R]."""
    refs = [reference_clip(utts, pick_reference(utts, utts.groups, int(i), rng), rng) for i in rows]
    refs = [np.zeros(0, dtype=np.int64) if r is None else r for r in refs]
    p_len, r_len = max(len(utts.phoneme_ids[i]) for i in rows), max(len(r) for r in refs)
    out = {"phonemes": torch.zeros(len(rows), p_len, dtype=torch.long),
           "valid": torch.zeros(len(rows), p_len, dtype=torch.bool),
           "log_frames": torch.zeros(len(rows), p_len),
           "ref": torch.zeros(len(rows), r_len, dtype=torch.long),
           "ref_valid": torch.zeros(len(rows), r_len, dtype=torch.bool)}
    for b, (i, ref) in enumerate(zip(rows, refs, strict=True)):
        pids = utts.phoneme_ids[i]
        frames = phoneme_durations(utts.starts[i], len(utts.codes[i]))
        out["phonemes"][b, :len(pids)] = torch.tensor(pids) - PHONEME_OFFSET
        out["valid"][b, :len(pids)] = True
        out["log_frames"][b, :len(pids)] = torch.log1p(torch.tensor(frames, dtype=torch.float32))
        out["ref"][b, :len(ref)] = torch.as_tensor(ref, dtype=torch.long)
        out["ref_valid"][b, :len(ref)] = True
    return out


def _loss(model: DurationModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    pred = model(batch["phonemes"], batch["valid"], batch["ref"], batch["ref_valid"])  # [B, P]
    return ((pred - batch["log_frames"]) ** 2)[batch["valid"]].mean()


@torch.no_grad()
def duration_errors(model: DurationModel, utts: Utterances, seed: int = 0) -> dict[str, float]:
    """On `utts`: mean absolute error in frames per phoneme, and the median |total - true| / true per
    utterance (how far the predicted utterance length is off)."""
    rng = np.random.default_rng(seed)
    abs_err, total_err = [], []
    for lo in range(0, len(utts), 32):
        batch = duration_batch(utts, range(lo, min(len(utts), lo + 32)), rng)
        pred = model.frames(batch["phonemes"], batch["valid"], batch["ref"], batch["ref_valid"])  # [B, P]
        true = torch.expm1(batch["log_frames"]).round()
        abs_err.append((pred - true).abs()[batch["valid"]])
        total_err.append((pred.sum(1) - true.sum(1)).abs() / true.sum(1))
    return {"frames_mae": float(torch.cat(abs_err).mean()),
            "length_error_median": float(torch.cat(total_err).median())}


@torch.no_grad()
def residual_variance(model: DurationModel, utts: Utterances, seed: int = 0) -> float:
    """Mean squared error of the predicted log(1 + frames) per phoneme on `utts`."""
    batch = duration_batch(utts, range(len(utts)), np.random.default_rng(seed))
    return float(_loss(model, batch))


def train_durations(train: Utterances, val: Utterances, codebook_size: int, out_dir: Path, *,
                    steps: int = 2500, batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
                    config: DurationConfig | None = None) -> DurationModel:
    """config: the model's shape (default: DurationConfig's)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = DurationModel(config or DurationConfig(codebook_size=codebook_size)).train()
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    history, start = [], time.time()
    for step in range(steps):
        rows = rng.choice(len(train), batch_size, replace=False)
        loss = _loss(model, duration_batch(train, rows, rng))
        optimizer_step(optim, loss, warmup_linear_decay(step, steps, lr, warmup=100, floor=0.05), clip=1.0)
        history.append({"step": step + 1, "loss": loss.item()})
        if (step + 1) % 100 == 0:
            print(f"[durations] step {step + 1}/{steps} loss {loss.item():.4f} {time.time() - start:.0f}s",
                  flush=True)
    model.eval()
    model.cfg = replace(model.cfg, log_bias=0.5 * residual_variance(model, val, seed))
    errors = duration_errors(model, val, seed)
    print(f"[durations] held-out: {json.dumps(errors)}", flush=True)
    model.save(out_dir)
    (out_dir / "train.json").write_text(json.dumps({"history": history, "held_out": errors}))
    return model
