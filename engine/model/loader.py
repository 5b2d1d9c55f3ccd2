"""Load a Hugging Face Llama checkpoint directory (config.json + one or many *.safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pcgtts.engine.model.config import DTYPES, LlamaConfig
from pcgtts.engine.model.llama import LayerWeights, LlamaModel, Projection, RMSNorm
from pcgtts.engine.model.rope import interleave_rope_rows
from safetensors import safe_open


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matrix products at (at least) fp32 speed. Without them (e.g. plain AVX-512)
    bf16 is emulated and slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


def resolve_dtype(name: str | torch.dtype, device: torch.device, compiled: bool = False) -> torch.dtype:
    """"auto": bfloat16 on CUDA, or on a CPU with native bf16 when decode graphs are compiled; else fp32."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        if device.type == "cuda" or (compiled and cpu_has_native_bf16()):
            return torch.bfloat16
        return torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    return files


class _Weights:
    """Reads tensors by name across shards, converting each to the target device and dtype."""

    def __init__(self, path: Path, device: torch.device, dtype: torch.dtype):
        self.device, self.dtype = device, dtype
        self.where: dict[str, Path] = {}
        for f in safetensors_files(path):
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    self.where[name.removeprefix("model.")] = (f, name)

    def has(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> torch.Tensor:
        f, full = self.where[name]
        with safe_open(str(f), framework="pt") as st:
            return st.get_tensor(full).to(device=self.device, dtype=self.dtype)

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.get(name) if self.has(name) else None

    def fused(self, names: list[str]) -> torch.Tensor | None:
        parts = [self.maybe(n) for n in names]
        if all(p is None for p in parts):
            return None
        return torch.cat(parts, dim=0)


def few_op_forms(device: torch.device, dtype: torch.dtype, compiled: bool = False) -> bool:
    """Whether a model's decode forwards run op by op on a CPU in float32 (eager), where each small torch op
    costs more than its arithmetic: then the loader picks the forms with fewer ops, interleaved RoPE
    (rope.py) and RMSNorm as a layer norm (llama.RMSNorm). Compiled graphs, CUDA and half precision keep
    the checkpoint's forms, which inductor and CUDA graphs fuse anyway."""
    return device.type == "cpu" and dtype == torch.float32 and not compiled


def load_llama(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "auto",
               max_positions: int | None = None, compiled: bool = False) -> LlamaModel:
    """compiled: the model's decode forwards will run as compiled graphs (keeps the checkpoint's forms,
    `few_op_forms`)."""
    path, device = Path(path), torch.device(device)
    cfg = LlamaConfig.from_dir(path)
    dtype = resolve_dtype(dtype, device)
    w = _Weights(path, device, dtype)
    few_ops = few_op_forms(device, dtype, compiled)
    layers = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        layers.append(LayerWeights(
            input_norm=RMSNorm(w.get(p + "input_layernorm.weight"), cfg.rms_norm_eps, few_ops),
            qkv=Projection(_qkv(w, attn, "weight", cfg, few_ops),
                           _qkv(w, attn, "bias", cfg, few_ops) if cfg.attention_bias else None),
            o=Projection(w.get(attn + "o_proj.weight"),
                         w.maybe(attn + "o_proj.bias") if cfg.attention_bias else None),
            post_norm=RMSNorm(w.get(p + "post_attention_layernorm.weight"), cfg.rms_norm_eps, few_ops),
            gate_up=Projection(
                w.fused([mlp + "gate_proj.weight", mlp + "up_proj.weight"]),
                w.fused([mlp + "gate_proj.bias", mlp + "up_proj.bias"]) if cfg.mlp_bias else None),
            down=Projection(w.get(mlp + "down_proj.weight"),
                            w.maybe(mlp + "down_proj.bias") if cfg.mlp_bias else None),
        ))
    embed = w.get("embed_tokens.weight")
    if cfg.tie_word_embeddings or not w.has("lm_head.weight"):
        lm_head = Projection(embed, copy=False)  # one matrix for both (a transposed copy would double it)
    else:
        lm_head = Projection(w.get("lm_head.weight"))
    return LlamaModel(cfg, embed, layers, RMSNorm(w.get("norm.weight"), cfg.rms_norm_eps, few_ops), lm_head,
                      max_positions or cfg.max_position_embeddings, interleaved_rope=few_ops)


def _qkv(w: _Weights, prefix: str, kind: str, cfg: LlamaConfig, interleaved: bool) -> torch.Tensor:
    """q, k and v projections' `kind` ("weight" or "bias") fused into one tensor along their output rows,
    q and k heads in interleaved-pair order when `interleaved` (rope.py)."""
    fused = w.fused([f"{prefix}{x}_proj.{kind}" for x in "qkv"])
    if not interleaved:
        return fused
    return interleave_rope_rows(fused, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim)
