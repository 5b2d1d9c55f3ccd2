"""The feature-head draft (engine/model/feature_head.py), trained on the target's own hidden states.

The target runs teacher-forced on training utterances (no gradient); the head learns to step the target's
final hidden state h_t with the next token x_{t+1} to a state whose LM-head distribution matches the
target's at t+1. Since the engine chains the head γ times on its own predictions, training unrolls it the
same way: step k starts from the head's (k-1)-th prediction, and the loss is the sum over k = 1..`unroll`
of KL(target || head) at the speech positions. The target's embeddings, final norm and LM head are shared
and frozen; only the head trains.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from pcgtts.engine.acceptance.warp import logits_to_probs
from pcgtts.engine.model.feature_head import FeatureHeadConfig
from pcgtts.engine.speech.demo.constraint import MarkerMergeConstraint
from pcgtts.engine.speech.demo.layout import DemoVocab
from pcgtts.recipes.demo.lm_data import IGNORE, BatchPlan, Utterances, held_out_batches, make_batch
from pcgtts.recipes.demo.train_draft import train_resumable
from safetensors.torch import load_file, save_file
from transformers import LlamaForCausalLM


class _Block(nn.Module):
    def __init__(self, width: int, inner: int, out: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(width, eps=eps)
        self.gate_up = nn.Linear(width, 2 * inner, bias=False)
        self.down = nn.Linear(inner, out, bias=False)
        nn.init.zeros_(self.down.weight)  # each block starts as the identity step (state unchanged)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.norm(z)).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class FeatureHeadModule(nn.Module):
    """The trainable twin of engine.model.feature_head.FeatureHead (same parameter names, same function)."""

    def __init__(self, cfg: FeatureHeadConfig, embed: torch.Tensor):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.cfg = cfg
        # [V, d] the target's: frozen, and not saved with the head
        self.register_buffer("embed", embed.detach(), persistent=False)
        self.token_norm = nn.RMSNorm(d, eps=eps)
        self.blocks = nn.ModuleList([_Block(2 * d if i == 0 else d, cfg.intermediate_size, d, eps)
                                     for i in range(cfg.num_blocks)])

    def forward(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """state [..., d] at t, tokens Long[...] x_{t+1} -> state at t+1."""
        z = torch.cat([state, self.token_norm(F.embedding(tokens, self.embed))], dim=-1)
        state = state + self.blocks[0](z)
        for block in self.blocks[1:]:
            state = state + block(state)
        return state

    def unroll(self, hidden: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """hidden [B, L, d] (the target's final states), input_ids [B, L] -> per k = 1..steps the predicted
        states [B, L-k, d]; entry j of step k starts from the target's state at j and has folded in tokens
        j+1..j+k, so it stands for position j+k and predicts the token at j+k+1 (HF logits row j+k)."""
        states, out = hidden, []
        for k in range(1, steps + 1):
            states = self(states[:, :-1], input_ids[:, k:])
            out.append(states)
        return out


def target_states(target: LlamaForCausalLM, batch: dict) -> torch.Tensor:
    """[B, L, d] the target's final hidden states (after its final norm: what its LM head reads)."""
    out = target.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return out.last_hidden_state


def train_head(target: LlamaForCausalLM, vocab: DemoVocab, utts: Utterances | None, out_dir: Path, *,
               inner: int = 384, blocks: int = 1, unroll: int = 4, steps: int = 2000, batch_size: int = 12,
               lr: float = 3e-3, seed: int = 11, time_budget_min: float | None = None,
               batches: Callable[[int], dict] | None = None, init: Path | None = None) -> FeatureHeadModule:
    """Train (or resume) a head in out_dir; returns it in eval mode. batches: step -> a batch (input_ids,
    attention_mask, labels; default: the corpus `utts` as make_batch gives them, self_distill.py gives the
    target's own samples); init: an exported head to start from (its width wins over `inner`/`blocks`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    target.eval().requires_grad_(False)
    if init is not None:
        head = load_head(init, target).train()
    else:
        cfg = FeatureHeadConfig(hidden_size=target.config.hidden_size, intermediate_size=inner,
                                num_blocks=blocks, vocab_size=target.config.vocab_size,
                                rms_norm_eps=target.config.rms_norm_eps)
        head = FeatureHeadModule(cfg, target.model.embed_tokens.weight.float()).train()
    optim = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    if batches is None:
        plan = BatchPlan(utts, batch_size, seed)
        batches = partial(make_batch, vocab, utts, plan)

    def step_loss(step: int) -> tuple[torch.Tensor, list[float]]:
        batch = batches(step)
        with torch.no_grad():
            hidden = target_states(target, batch)  # [B, L, d]
            t_logp = torch.log_softmax(target.lm_head(hidden).float(), -1)  # [B, L, V]
        keep = batch["labels"] != IGNORE  # [B, L] rows predicting generated speech
        kls = []
        for k, states in enumerate(head.unroll(hidden, batch["input_ids"], unroll), 1):
            rows = keep[:, k:]
            want = t_logp[:, k:][rows]  # [n, V]
            got = torch.log_softmax(target.lm_head(states[rows]), -1)
            kls.append((want.exp() * (want - got)).sum(-1).mean())
        return torch.stack(kls).sum(), [x.item() for x in kls]

    train_resumable(head, optim, out_dir, "head", step_loss, steps=steps, lr=lr,
                    time_budget_min=time_budget_min,
                    describe=lambda kls: f"KL by step {[round(x, 3) for x in kls]}")
    return head.eval()


def load_head(head_dir: Path, target: LlamaForCausalLM) -> FeatureHeadModule:
    """An exported head (export_head's directory) as the trainable module, in eval mode, weights in fp32."""
    head = FeatureHeadModule(FeatureHeadConfig.from_dir(head_dir), target.model.embed_tokens.weight.float())
    head.load_state_dict({k: v.float() for k, v in load_file(str(head_dir / "model.safetensors")).items()})
    return head.eval()


def export_head(head: FeatureHeadModule, out_dir: Path) -> None:
    """The engine's checkpoint directory (fp16 weights, as the bundle's Llama checkpoints)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to(torch.float16).contiguous() for k, v in head.state_dict().items()}
    save_file(weights, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(head.cfg.to_json())


@torch.no_grad()
def held_out_acceptance_by_step(target: LlamaForCausalLM, head: FeatureHeadModule, vocab: DemoVocab,
                                utts: Utterances, *, steps: int = 4, temperature: float = 0.8,
                                count: int = 96, batch_size: int = 12, seed: int = 0) -> list[float]:
    """Per draft step k = 1..steps, the mean of Σ_t min(p(t), q(t)) (Leviathan's α) between the head's k-th
    chained proposal and the target, teacher-forced on `count` held-out utterances, both distributions as the
    engine samples them (marker-merge constraint without caps, then temperature). Comparable to
    train_draft.held_out_acceptance, which is the same number for a Llama draft at every step."""
    rng = np.random.default_rng(seed)
    shares: list[list[torch.Tensor]] = [[] for _ in range(steps)]
    for rows, batch in held_out_batches(vocab, utts, rng, batch_size, count):
        hidden = target_states(target, batch)
        t_logits = target.lm_head(hidden).float()  # [B, L, V]
        unrolled = [target.lm_head(s).float() for s in head.unroll(hidden, batch["input_ids"], steps)]
        for b, i in enumerate(rows):
            keep = batch["labels"][b] != IGNORE
            at = keep.nonzero().flatten()  # [n] logits rows predicting speech
            speech = batch["labels"][b][keep].tolist()
            constraint = MarkerMergeConstraint(vocab, utts.phoneme_ids[i])
            histories = [speech[:k] for k in range(len(speech))]
            q = logits_to_probs(constraint.apply(t_logits[b][at], histories), temperature)  # [n, V]
            for k, logits in enumerate(unrolled, 1):
                ok = at >= k  # step k's proposal for row r starts from the target's state at r - k
                draft_logits = torch.zeros_like(t_logits[b][at])
                draft_logits[ok] = logits[b][at[ok] - k]
                p = logits_to_probs(constraint.apply(draft_logits, histories), temperature)
                shares[k - 1].append(torch.minimum(p, q).sum(-1)[ok])
    return [float(torch.cat(s).mean()) for s in shares]
