"""A draft that reads the target's hidden state instead of keeping its own context (EAGLE / ReDrafter-style).

The target's final hidden state h_t (after its final norm) at the position that produced token x_{t+1}
already summarises the whole context; the head only has to fold in x_{t+1}:

    f_{t+1} = h_t + block_0([h_t ; RMSNorm(E x_{t+1})]) + block_1(..) + ...
    block(z) = down(silu(gate) * up),  gate, up = gate_up(RMSNorm(z))

and the target's own LM head turns f_{t+1} into the draft distribution of x_{t+2}. γ proposals chain the head
on its own predicted states. No attention, so no KV cache: a draft step is a few small matrix products and
the draft has nothing to prefill or roll back. At batch 1 on a CPU a step costs about the bytes of its
weights, a small fraction of a target forward (`pcgtts bench step` measures it as c). E is the target's
embedding table (shared, not stored).

Checkpoint: a directory with config.json ({"architectures": ["PcgttsFeatureHead"], hidden_size,
intermediate_size, num_blocks, vocab_size, rms_norm_eps}) and model.safetensors with
token_norm.weight [d], blocks.{i}.norm.weight ([2d] for block 0, [d] after), blocks.{i}.gate_up.weight
[2I, in], blocks.{i}.down.weight [d, I]. recipes/demo/train_draft_head.py trains and writes one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from pcgtts.engine.batch_invariance import InvariancePlan
from pcgtts.engine.model.llama import LlamaModel, Projection, RMSNorm
from safetensors.torch import load_file

ARCHITECTURE = "PcgttsFeatureHead"


@dataclass(frozen=True)
class FeatureHeadConfig:
    hidden_size: int
    intermediate_size: int
    num_blocks: int
    vocab_size: int
    rms_norm_eps: float = 1e-6

    @classmethod
    def from_dir(cls, path: str | Path) -> FeatureHeadConfig:
        raw = json.loads((Path(path) / "config.json").read_text())
        return cls(hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
                   num_blocks=raw["num_blocks"], vocab_size=raw["vocab_size"],
                   rms_norm_eps=raw.get("rms_norm_eps", 1e-6))

    def to_json(self) -> str:
        return json.dumps({"architectures": [ARCHITECTURE], "hidden_size": self.hidden_size,
                           "intermediate_size": self.intermediate_size, "num_blocks": self.num_blocks,
                           "vocab_size": self.vocab_size, "rms_norm_eps": self.rms_norm_eps}, indent=1)


def is_feature_head(path: str | Path) -> bool:
    """Whether a draft directory holds a feature head (else: a Llama checkpoint)."""
    config = Path(path) / "config.json"
    return config.exists() and ARCHITECTURE in json.loads(config.read_text()).get("architectures", [])


@dataclass
class _Block:
    norm: RMSNorm  # [in]
    gate_up: Projection  # in -> 2 I
    down: Projection  # I -> d

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.norm(z)).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class FeatureHead:
    def __init__(self, cfg: FeatureHeadConfig, embed: torch.Tensor, token_norm: RMSNorm,
                 blocks: list[_Block]):
        self.cfg = cfg
        self.embed = embed  # [V, d], the target's
        self.token_norm = token_norm
        self.blocks = blocks

    def apply_plan(self, plan: InvariancePlan) -> None:
        """As LlamaModel.apply_plan (engine/batch_invariance.py)."""
        for block in self.blocks:
            block.gate_up.apply_plan(plan)
            block.down.apply_plan(plan)
            block.norm.row_invariant = plan.active
        self.token_norm.row_invariant = plan.active

    def projections(self) -> list[Projection]:
        return [p for block in self.blocks for p in (block.gate_up, block.down)]

    def int8_projections(self) -> list[Projection]:
        """As LlamaModel.int8_projections: the normed inputs' products, not `down`."""
        return [block.gate_up for block in self.blocks]

    def norms(self) -> list[RMSNorm]:
        return [self.token_norm] + [block.norm for block in self.blocks]

    @torch.inference_mode()
    def __call__(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """state [B, d] at position t (the target's, or predicted), tokens Long[B] x_{t+1} -> state at t+1."""
        z = torch.cat([state, self.token_norm(F.embedding(tokens, self.embed))], dim=-1)  # [B, 2d]
        state = state + self.blocks[0](z)
        for block in self.blocks[1:]:
            state = state + block(state)
        return state


def load_feature_head(path: str | Path, target: LlamaModel, few_ops: bool = False) -> FeatureHead:
    """The head in `path`, on the target's device and dtype, sharing its embedding table. few_ops: the
    loader's CPU float32 eager forms (RMSNorm as a layer norm)."""
    cfg = FeatureHeadConfig.from_dir(path)
    if cfg.hidden_size != target.cfg.hidden_size or cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"feature head of width {cfg.hidden_size} over {cfg.vocab_size} tokens does not fit "
                         f"a target of width {target.cfg.hidden_size} over {target.cfg.vocab_size}")
    weights = {k: v.to(device=target.device, dtype=target.dtype)
               for k, v in load_file(str(Path(path) / "model.safetensors")).items()}
    eps = cfg.rms_norm_eps
    blocks = [_Block(RMSNorm(weights[f"blocks.{i}.norm.weight"], eps, few_ops),
                     Projection(weights[f"blocks.{i}.gate_up.weight"]),
                     Projection(weights[f"blocks.{i}.down.weight"]))
              for i in range(cfg.num_blocks)]
    return FeatureHead(cfg, target.embed, RMSNorm(weights["token_norm.weight"], eps, few_ops), blocks)
