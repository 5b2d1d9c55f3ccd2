"""The draft: the target's embeddings, first layer(s), final norm and LM head, distilled from the target.

Distillation minimises KL(target || draft) over the generated part of training sequences (teacher-forced
target distributions computed on the fly), so the draft learns to propose what the target would sample.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaForCausalLM

from engine.acceptance.warp import logits_to_probs
from engine.speech.demo.constraint import MarkerMergeConstraint
from engine.speech.demo.layout import DemoVocab
from recipes.demo.lm_data import IGNORE, BatchPlan, Utterances, held_out_batches, make_batch
from recipes.demo.optim import optimizer_step, warmup_linear_decay
from recipes.demo.train_lm import ModelSize


def draft_from_target(target: LlamaForCausalLM, layers: int = 1) -> LlamaForCausalLM:
    """A `layers`-layer Llama sharing the target's shapes, initialised from its first layers."""
    cfg = target.config.__class__(**target.config.to_dict())
    cfg.num_hidden_layers = layers
    draft = LlamaForCausalLM(cfg)
    own = draft.state_dict()
    draft.load_state_dict({k: v.clone() for k, v in target.state_dict().items() if k in own})
    return draft


def distill(target: LlamaForCausalLM, vocab: DemoVocab, utts: Utterances, out_dir: Path, *, layers: int = 1,
            steps: int = 400, batch_size: int = 12, lr: float = 6e-3, seed: int = 1) -> LlamaForCausalLM:
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    target.eval()
    draft = draft_from_target(target, layers).train()
    optim = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    plan = BatchPlan(utts, batch_size, seed)  # a different order from the target's (seed differs)
    history, start = [], time.time()
    for step in range(steps):
        batch = make_batch(vocab, utts, plan, step)
        keep = batch["labels"] != IGNORE  # [B, L] positions whose next token is generated speech
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with torch.no_grad():
            t_logp = torch.log_softmax(target(**inputs).logits[keep].float(), -1)  # [n, V]
        d_logp = torch.log_softmax(draft(**inputs).logits[keep], -1)  # [n, V]
        loss = (t_logp.exp() * (t_logp - d_logp)).sum(-1).mean()  # KL(target || draft)
        optimizer_step(optim, loss, warmup_linear_decay(step, steps, lr, warmup=50, floor=0.1), clip=1.0)
        history.append({"step": step + 1, "kl": loss.item(), "time": time.time()})
        if (step + 1) % 25 == 0:
            print(f"[draft] step {step + 1}/{steps} KL {loss.item():.3f} {time.time() - start:.0f}s",
                  flush=True)
    (out_dir / "history.json").write_text(json.dumps(history))
    (out_dir / "size.json").write_text(json.dumps(asdict(ModelSize(layers=layers)) | {"from": "target"}))
    return draft.eval()


@torch.no_grad()
def held_out_acceptance(target: LlamaForCausalLM, draft: LlamaForCausalLM, vocab: DemoVocab,
                        utts: Utterances, *, temperature: float = 0.8, count: int = 96, batch_size: int = 12,
                        seed: int = 0) -> float:
    """Mean per-token acceptance probability of exact speculative sampling, Σ_t min(p(t), q(t)), with target
    and draft teacher-forced on `count` utterances and both distributions taken as the engine samples them
    (marker-merge constraint without caps, then temperature). This is Leviathan et al.'s α, the one the
    speed-up model uses; the engine's accepted/drafted rate is lower, since it counts every draft after a
    rejection as rejected."""
    rng = np.random.default_rng(seed)
    shares = []
    for rows, batch in held_out_batches(vocab, utts, rng, batch_size, count):
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        t_logits, d_logits = target(**inputs).logits.float(), draft(**inputs).logits.float()  # [B, L, V]
        for b, i in enumerate(rows):
            keep = batch["labels"][b] != IGNORE  # [L] positions predicting generated speech
            speech = batch["labels"][b][keep].tolist()
            constraint = MarkerMergeConstraint(vocab, utts.phoneme_ids[i])
            histories = [speech[:k] for k in range(len(speech))]
            p = logits_to_probs(constraint.apply(t_logits[b][keep], histories), temperature)  # [n, V]
            q = logits_to_probs(constraint.apply(d_logits[b][keep], histories), temperature)  # [n, V]
            shares.append(torch.minimum(p, q).sum(-1))
    return float(torch.cat(shares).mean())
