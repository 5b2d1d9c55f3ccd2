"""The subset of a Hugging Face Llama `config.json` the engine's model needs.

Accepts both the transformers 4.x layout (`rope_theta` + `rope_scaling`) and the 5.x one
(`rope_parameters` holding both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # {"rope_type": "llama3" | "linear" | "default", ...}
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    checkpoint_dtype: torch.dtype

    @classmethod
    def from_dict(cls, raw: dict) -> LlamaConfig:
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"only SwiGLU (silu) Llama MLPs are supported, got hidden_act={act!r}")
        heads = raw["num_attention_heads"]
        rope = dict(raw.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", raw.get("rope_theta", 10000.0))
        scaling = raw.get("rope_scaling") or rope or None
        if scaling is not None:
            scaling = dict(scaling)
            scaling["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
            if scaling["rope_type"] == "default":
                scaling = None
        dtype_name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            checkpoint_dtype=DTYPES.get(str(dtype_name), torch.float32),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> LlamaConfig:
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()))

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes of K and V over all layers for one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.finfo(dtype).bits // 8
