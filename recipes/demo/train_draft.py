"""The draft, distilled from the target.

Two shapes: the target's own width (its embeddings, first layer(s), final norm and LM head, copied), or a
narrower Llama (`DraftShape`, e.g. 1 layer of d=128), whose embeddings and LM head start as the target's
projected onto their top principal directions and whose layers start fresh: a forward of the narrow one costs
a small fraction of the target's (c = draft / target forward), which is what speculative decoding needs.

Distillation minimises KL(target || draft) over the generated part of training sequences (teacher-forced
target distributions computed on the fly), so the draft learns to propose what the target would sample.
Checkpoints every CHECKPOINT_STEPS steps; an interrupted run resumes. A time budget shortens the schedule:
the learning rate decays by whichever is further along, steps or time, and training stops when either ends.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pcgtts.engine.acceptance.warp import logits_to_probs
from pcgtts.engine.speech.demo.constraint import MarkerMergeConstraint
from pcgtts.engine.speech.demo.layout import DemoVocab
from pcgtts.recipes.demo.lm_data import IGNORE, BatchPlan, Utterances, held_out_batches, make_batch
from pcgtts.recipes.demo.optim import optimizer_step, warmup_linear_decay
from transformers import LlamaForCausalLM

CHECKPOINT_STEPS = 100
# a fresh narrow draft's attention heads and FFN width when its DraftShape leaves them open
FRESH_HEADS, FRESH_INTERMEDIATE = 2, 344


@dataclass(frozen=True)
class DraftShape:
    """A draft narrower than its target; `hidden` = None keeps the target's width (and copies its weights).
    `heads` / `intermediate` None: a fresh draft gets FRESH_HEADS and FRESH_INTERMEDIATE, a draft started
    from a wider one (`distill(init_from=...)`) keeps the source's; given, the latter is pruned to them
    (`prune_draft`)."""

    layers: int = 1
    hidden: int | None = None
    heads: int | None = None
    intermediate: int | None = None

    @classmethod
    def parse(cls, text: str) -> DraftShape:
        """"same" (the target's width, 1 layer) or LAYERSxHIDDEN[xHEADSxFFN]: "1x128", "1x128x2x344"."""
        if text == "same":
            return cls()
        parts = [int(x) for x in text.split("x")]
        if len(parts) not in (2, 4):
            raise ValueError(f"draft shape {text!r}: want 'same', LAYERSxHIDDEN or LAYERSxHIDDENxHEADSxFFN")
        return cls(*parts) if len(parts) == 4 else cls(parts[0], parts[1])


def draft_from_target(target: LlamaForCausalLM, layers: int = 1) -> LlamaForCausalLM:
    """A `layers`-layer Llama sharing the target's shapes, initialised from its first layers."""
    cfg = target.config.__class__(**target.config.to_dict())
    cfg.num_hidden_layers = layers
    draft = LlamaForCausalLM(cfg)
    own = draft.state_dict()
    draft.load_state_dict({k: v.clone() for k, v in target.state_dict().items() if k in own})
    return draft


@torch.no_grad()
def narrow_draft(target: LlamaForCausalLM, shape: DraftShape, seed: int = 0) -> LlamaForCausalLM:
    """A `shape.hidden`-wide Llama whose embeddings and LM head are the target's projected onto the top
    `shape.hidden` right-singular directions of [embeddings ; LM head x final-norm gain] (both live in the
    target's residual space), so token identities and their readout start aligned; layers start fresh."""
    torch.manual_seed(seed)
    cfg = target.config.__class__(**target.config.to_dict())
    heads = shape.heads or FRESH_HEADS
    cfg.num_hidden_layers, cfg.hidden_size = shape.layers, shape.hidden
    cfg.num_attention_heads = cfg.num_key_value_heads = heads
    cfg.head_dim, cfg.intermediate_size = shape.hidden // heads, shape.intermediate or FRESH_INTERMEDIATE
    draft = LlamaForCausalLM(cfg)
    emb = target.model.embed_tokens.weight.float()  # [V, D]
    head = target.lm_head.weight.float() * target.model.norm.weight.float()  # [V, D]
    basis = torch.linalg.svd(torch.cat([emb, head]), full_matrices=False).Vh[: shape.hidden].T  # [D, d]
    draft.model.embed_tokens.weight.copy_(emb @ basis)
    draft.lm_head.weight.copy_(head @ basis)
    draft.model.norm.weight.fill_(1.0)
    return draft


@torch.no_grad()
def project_draft(source: LlamaForCausalLM, hidden: int, input_ids: torch.Tensor) -> LlamaForCausalLM:
    """A `hidden`-wide copy of a wider draft: its residual stream confined to the top `hidden` principal
    directions P [D, d] of the source's residual states on `input_ids` [B, L] (uncentred), every weight
    re-expressed there. Readers of the stream (q/k/v, gate/up, head) become W diag(g) P x s and writers
    (o, down) Pᵀ W, with the RMSNorm gains g folded in and set to 1; s = sqrt(D/d) x the captured norm share
    keeps RMSNorm's scale, since RMS over d of Pᵀh differs from RMS over D of h. Heads, head size and FFN
    stay the source's, so the copy starts close to the source's distributions and fine-tunes from there."""
    states = source(input_ids=input_ids, output_hidden_states=True).hidden_states  # (L+1) x [B, T, D]
    flat = torch.cat([h.reshape(-1, h.shape[-1]) for h in states]).float()  # [N, D]
    basis = torch.linalg.svd(flat, full_matrices=False).Vh[:hidden].T  # [D, d]
    share = float((flat @ basis).norm() / flat.norm())  # root of the captured energy (pad rows are zero)
    scale = (source.config.hidden_size / hidden) ** 0.5 * share
    cfg = source.config.__class__(**source.config.to_dict())
    head_dim = source.config.head_dim or source.config.hidden_size // cfg.num_attention_heads
    cfg.hidden_size, cfg.head_dim = hidden, head_dim
    draft = LlamaForCausalLM(cfg)
    src, dst = source.model, draft.model
    dst.embed_tokens.weight.copy_(src.embed_tokens.weight @ basis)
    for a, b in zip(src.layers, dst.layers, strict=True):
        g1, g2 = a.input_layernorm.weight[:, None], a.post_attention_layernorm.weight[:, None]
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(b.self_attn, name).weight.copy_(getattr(a.self_attn, name).weight @ (g1 * basis) * scale)
        b.self_attn.o_proj.weight.copy_(basis.T @ a.self_attn.o_proj.weight)
        for name in ("gate_proj", "up_proj"):
            getattr(b.mlp, name).weight.copy_(getattr(a.mlp, name).weight @ (g2 * basis) * scale)
        b.mlp.down_proj.weight.copy_(basis.T @ a.mlp.down_proj.weight)
        b.input_layernorm.weight.fill_(1.0)
        b.post_attention_layernorm.weight.fill_(1.0)
    draft.lm_head.weight.copy_(source.lm_head.weight @ (src.norm.weight[:, None] * basis) * scale)
    dst.norm.weight.fill_(1.0)
    return draft


@torch.no_grad()
def prune_draft(source: LlamaForCausalLM, heads: int | None, intermediate: int | None) -> LlamaForCausalLM:
    """A copy of `source` keeping, in every layer, the `heads` attention heads and `intermediate` FFN units
    that carry the most weight: a head by |W_v rows| x |W_o columns| (what it can write into the stream), a
    unit by |gate row| x |up row| x |down column|. None keeps them all. Units with zero weight are dropped
    first, so pruning them away leaves the function unchanged. Multi-head attention only (as the recipe's
    drafts are)."""
    cfg = source.config.__class__(**source.config.to_dict())
    if cfg.num_key_value_heads != cfg.num_attention_heads:
        raise ValueError("prune_draft handles multi-head attention only (num_key_value_heads == num_heads)")
    head_dim = cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads
    cfg.num_attention_heads = cfg.num_key_value_heads = heads or cfg.num_attention_heads
    cfg.intermediate_size = intermediate or cfg.intermediate_size
    cfg.head_dim = head_dim
    draft = LlamaForCausalLM(cfg)
    state = {k: v.clone() for k, v in source.state_dict().items()}
    for i, layer in enumerate(source.model.layers):
        attn, mlp, p = layer.self_attn, layer.mlp, f"model.layers.{i}."
        v_rows = attn.v_proj.weight.view(-1, head_dim, attn.v_proj.weight.shape[1])  # [H, D, d]
        o_cols = attn.o_proj.weight.view(attn.o_proj.weight.shape[0], -1, head_dim)  # [d, H, D]
        head_mass = v_rows.flatten(1).norm(dim=1) * o_cols.transpose(0, 1).flatten(1).norm(dim=1)  # [H]
        kept_heads = head_mass.topk(cfg.num_attention_heads).indices.sort().values
        rows = (kept_heads[:, None] * head_dim + torch.arange(head_dim)).flatten()  # [H' D]
        unit_mass = (mlp.gate_proj.weight.norm(dim=1) * mlp.up_proj.weight.norm(dim=1)
                     * mlp.down_proj.weight.norm(dim=0))  # [I]
        units = unit_mass.topk(cfg.intermediate_size).indices.sort().values
        for name in ("q_proj", "k_proj", "v_proj"):
            state[p + f"self_attn.{name}.weight"] = state[p + f"self_attn.{name}.weight"][rows]
        state[p + "self_attn.o_proj.weight"] = state[p + "self_attn.o_proj.weight"][:, rows]
        for name in ("gate_proj", "up_proj"):
            state[p + f"mlp.{name}.weight"] = state[p + f"mlp.{name}.weight"][units]
        state[p + "mlp.down_proj.weight"] = state[p + "mlp.down_proj.weight"][:, units]
    draft.load_state_dict(state)
    return draft


def make_draft(target: LlamaForCausalLM, shape: DraftShape, seed: int = 0) -> LlamaForCausalLM:
    if shape.hidden is None:
        return draft_from_target(target, shape.layers)
    return narrow_draft(target, shape, seed)


def distill(target: LlamaForCausalLM, vocab: DemoVocab, utts: Utterances, out_dir: Path, *,
            shape: DraftShape = DraftShape(), steps: int = 400, batch_size: int = 12, lr: float = 6e-3,
            seed: int = 1, time_budget_min: float | None = None,
            init_from: LlamaForCausalLM | None = None) -> LlamaForCausalLM:
    """init_from: a wider draft of the same target to start from, projected to `shape.hidden`
    (`project_draft`) and pruned to `shape.heads` / `shape.intermediate` where given (`prune_draft`),
    instead of `make_draft`'s initialisation."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    target.eval()
    plan = BatchPlan(utts, batch_size, seed)  # a different order from the target's (seed differs)
    if init_from is not None:
        probe = make_batch(vocab, utts, BatchPlan(utts, batch_size, seed + 7), 0)["input_ids"]
        draft = project_draft(init_from.float().eval(), shape.hidden, probe)
        draft = prune_draft(draft, shape.heads, shape.intermediate).train()
    else:
        draft = make_draft(target, shape, seed).train()
    optim = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)

    def step_loss(step: int) -> tuple[torch.Tensor, float]:
        batch = make_batch(vocab, utts, plan, step)
        keep = batch["labels"] != IGNORE  # [B, L] positions whose next token is generated speech
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with torch.no_grad():
            t_logp = torch.log_softmax(target(**inputs).logits[keep].float(), -1)  # [n, V]
        d_logp = torch.log_softmax(draft(**inputs).logits[keep], -1)  # [n, V]
        loss = (t_logp.exp() * (t_logp - d_logp)).sum(-1).mean()  # KL(target || draft)
        return loss, loss.item()

    step = train_resumable(draft, optim, out_dir, "draft", step_loss, steps=steps, lr=lr,
                           time_budget_min=time_budget_min, describe=lambda kl: f"KL {kl:.3f}")
    cfg = draft.config
    size = {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
            "head_dim": cfg.head_dim, "intermediate": cfg.intermediate_size}
    source = "target" if init_from is None else "a wider draft, projected"
    (out_dir / "size.json").write_text(json.dumps(size | {"from": source, "steps": step}))
    return draft.eval()


def train_resumable(model: torch.nn.Module, optim: torch.optim.Optimizer, out_dir: Path, name: str,
                    step_loss, *, steps: int, lr: float, time_budget_min: float | None, describe) -> int:
    """The recipe's draft training loop: step_loss(step) -> (loss, record) for that step's batch; AdamW
    steps on a warmup-linear-decay schedule; `record` (the KL, as `describe` prints it) kept per step in
    out_dir/history.json. Checkpoints every CHECKPOINT_STEPS steps and resumes from out_dir/ckpt.pt. A
    time budget shortens the schedule: the learning rate decays by whichever is further along, steps or
    time, and training stops when either ends. Returns the step reached."""
    history, first, spent = [], 0, 0.0
    ckpt_path = out_dir / "ckpt.pt"
    if ckpt_path.exists():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(state["draft"])
        optim.load_state_dict(state["optim"])
        history, first, spent = state["history"], state["step"], state["seconds"]
        print(f"[{name}] resumed at step {first} ({spent / 60:.1f} min spent)", flush=True)
    budget = None if time_budget_min is None else 60 * time_budget_min
    start = time.time() - spent
    step = first
    for step in range(first, steps):
        elapsed = time.time() - start
        if budget is not None and elapsed >= budget:
            print(f"[{name}] time budget spent at step {step}", flush=True)
            break
        # progress by steps or by time, whichever is further: the schedule always ends decayed
        at = max(step, int(steps * elapsed / budget) if budget else 0)
        loss, record = step_loss(step)
        optimizer_step(optim, loss, warmup_linear_decay(at, steps, lr, warmup=50, floor=0.1), clip=1.0)
        history.append({"step": step + 1, "kl": record, "time": time.time()})
        if (step + 1) % 25 == 0:
            print(f"[{name}] step {step + 1}/{steps} {describe(record)} {time.time() - start:.0f}s",
                  flush=True)
        if (step + 1) % CHECKPOINT_STEPS == 0:
            save_checkpoint(ckpt_path, model, optim, history, step + 1, time.time() - start)
    else:
        step = steps
    save_checkpoint(ckpt_path, model, optim, history, step, time.time() - start)
    (out_dir / "history.json").write_text(json.dumps(history))
    return step


def save_checkpoint(path: Path, draft: torch.nn.Module, optim: torch.optim.Optimizer, history: list,
                    step: int, seconds: float) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"draft": draft.state_dict(), "optim": optim.state_dict(), "history": history, "step": step,
                "seconds": seconds}, tmp)
    tmp.rename(path)


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
