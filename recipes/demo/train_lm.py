"""Train a demo speech LM (a transformers LlamaForCausalLM) on the prepared corpus, resumably.

The learning rate warms up, stays constant, then decays linearly to 10% over the last `decay_steps`
before `max_steps` (a warmup-stable-decay schedule, so a run can be extended by raising `max_steps`
while it is still in the stable phase). A checkpoint (model, optimiser, step, loss history) is written
every `checkpoint_min` minutes and at the end; an interrupted run resumes from it and, because batches
are a function of the step, continues exactly where it stopped.
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from pcgtts.engine.speech.demo.layout import BOS, END, PAD, DemoVocab
from pcgtts.recipes.demo.lm_data import BatchPlan, Utterances, held_out_batches, make_batch
from pcgtts.recipes.demo.optim import optimizer_step
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass
class ModelSize:
    layers: int = 6
    hidden: int = 256
    heads: int = 4
    intermediate: int = 688

    def config(self, vocab_size: int) -> LlamaConfig:
        return LlamaConfig(vocab_size=vocab_size, hidden_size=self.hidden,
                           intermediate_size=self.intermediate, num_hidden_layers=self.layers,
                           num_attention_heads=self.heads,
                           num_key_value_heads=self.heads, max_position_embeddings=2048,
                           bos_token_id=BOS, eos_token_id=END, pad_token_id=PAD, tie_word_embeddings=False)


@dataclass
class TrainConfig:
    batch_size: int = 12
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 200
    max_steps: int = 3000
    decay_steps: int = 600
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_min: float = 10.0
    eval_every: int = 250
    speaker_warp: float = 0.0  # share of examples turned into a pseudo-speaker (needs train(code_maps=...))

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        decay_start = self.max_steps - self.decay_steps
        if step < decay_start:
            return self.lr
        frac = min(1.0, (step - decay_start) / max(1, self.decay_steps))
        return self.lr * (1.0 - (1.0 - self.min_lr_ratio) * frac)


def validation_loss(model, vocab: DemoVocab, utts: Utterances, seed: int, batch_size: int = 16) -> float:
    """Teacher-forced mean token loss on held-out utterances (fixed references, no corruption)."""
    rng = np.random.default_rng([seed, 999])
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for _, batch in held_out_batches(vocab, utts, rng, batch_size):
            n = int((batch["labels"][:, 1:] != -100).sum())
            total += model(**batch).loss.item() * n
            count += n
    model.train()
    return total / count


def train(out_dir: Path, vocab: DemoVocab, train_utts: Utterances, val_utts: Utterances, size: ModelSize,
          cfg: TrainConfig, *, init_from: Path | None = None, device: str = "cpu",
          time_budget_min: float | None = None, code_maps: np.ndarray | None = None) -> int:
    """Train (or resume) into out_dir/ckpt.pt; returns the step reached (< cfg.max_steps if stopped early)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = out_dir / "ckpt.pt"
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(size.config(vocab.vocab_size))
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    step, history = 0, []
    if ckpt_path.exists():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        step, history = state["step"], state["history"]
        print(f"[train] resumed at step {step}", flush=True)
    elif init_from is not None:
        model.load_state_dict(LlamaForCausalLM.from_pretrained(init_from).float().state_dict())
        print(f"[train] initialised from {init_from}", flush=True)
    model.to(device).train()
    plan = BatchPlan(train_utts, cfg.batch_size, cfg.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"[train] {params / 1e6:.2f}M parameters, {len(train_utts)} utterances, "
          f"{plan.per_epoch} steps/epoch, config {asdict(size)} {asdict(cfg)}",
          flush=True)

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))

    def save() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step,
                    "history": history, "size": asdict(size), "train": asdict(cfg)}, tmp)
        tmp.rename(ckpt_path)
        (out_dir / "history.json").write_text(json.dumps(history))

    start = last_save = time.time()
    tokens, t_window = 0, time.time()
    while step < cfg.max_steps and not stop["now"]:
        if time_budget_min is not None and time.time() - start > 60 * time_budget_min:
            break
        batch = {k: v.to(device) for k, v in make_batch(vocab, train_utts, plan, step, code_maps,
                                                                 cfg.speaker_warp).items()}
        loss = model(**batch).loss
        optimizer_step(optim, loss, cfg.lr_at(step), clip=cfg.grad_clip)
        step += 1
        tokens += int(batch["attention_mask"].sum())
        record = {"step": step, "loss": loss.item(), "lr": cfg.lr_at(step - 1), "time": time.time()}
        if step % 25 == 0:
            rate = tokens / (time.time() - t_window)
            print(f"[train] step {step}/{cfg.max_steps} loss {loss.item():.3f} lr {record['lr']:.2e} "
                  f"{rate:.0f} tok/s", flush=True)
            tokens, t_window = 0, time.time()
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            record["val_loss"] = validation_loss(model, vocab, val_utts, cfg.seed)
            print(f"[train] step {step} val_loss {record['val_loss']:.3f}", flush=True)
        history.append(record)
        if time.time() - last_save > 60 * cfg.checkpoint_min:
            save()
            last_save = time.time()
    save()
    print(f"[train] saved step {step}", flush=True)
    return step


def export(ckpt_path: Path, out_dir: Path, dtype: torch.dtype = torch.float16) -> None:
    """Checkpoint -> Hugging Face directory (config.json + model.safetensors) in `dtype`."""
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    size = ModelSize(**state["size"])
    vocab_size = state["model"]["model.embed_tokens.weight"].shape[0]
    model = LlamaForCausalLM(size.config(vocab_size))
    model.load_state_dict(state["model"])
    model.to(dtype).save_pretrained(out_dir, safe_serialization=True)


def perplexity(loss: float) -> float:
    return math.exp(loss)
