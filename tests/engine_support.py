"""Tiny random Llama checkpoints for the engine tests, written by `transformers` into temporary dirs."""

from __future__ import annotations

import os
from pathlib import Path

import torch

# bench/gpu_check.sh runs the equivalence tests on CUDA with PCGTTS_TEST_DEVICE=cuda.
DEVICE = os.environ.get("PCGTTS_TEST_DEVICE", "cpu")


def engine_config(target, **kw):
    """EngineConfig on the test device, with float32 products unless a test asks for other weights: the
    sampling and acceptance tests compare the engine's draws with a float32 reference of the model, and bf16
    products (the default on AMX CPUs) change the model's distribution itself, a quality trade measured in
    bench/results/ and tested on its own."""
    from pcgtts.engine import EngineConfig

    return EngineConfig(target=target, device=DEVICE, **{"cpu_weights": "fp32", **kw})


def save_tiny_llama(path: Path, *, vocab: int = 512, hidden: int = 64, layers: int = 2, heads: int = 4,
                    kv_heads: int = 2, intermediate: int = 128, tie: bool = False,
                    rope_scaling: dict | None = None, seed: int = 0, init_std: float = 0.1,
                    max_positions: int = 2048, residual_gain: float = 1.0,
                    dtype: torch.dtype = torch.float32) -> Path:
    """A random LlamaForCausalLM saved with save_pretrained; init_std well above HF's 0.02 so that
    next-token distributions are peaked enough to make greedy decoding and acceptance meaningful.
    residual_gain < 1 shrinks what each layer adds to the residual stream (o_proj, down_proj), so that a
    draft made of the first layers agrees with the target often, like a trained draft does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max_positions, tie_word_embeddings=tie,
                      initializer_range=init_std, rope_scaling=rope_scaling, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():  # random norm gains, so that a norm-weight mix-up cannot go unnoticed
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif "o_proj" in name or "down_proj" in name:
                p.mul_(residual_gain)
    model.save_pretrained(path)
    return path


def save_draft_from(target_dir: Path, path: Path, *, layers: int = 1, noise: float = 0.0,
                    seed: int = 1) -> Path:
    """A draft that keeps the target's embeddings, head and first `layers` layers (plus noise), so that it
    agrees with the target often but not always."""
    from transformers import LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    cfg = target.config
    cfg.num_hidden_layers = layers
    draft = LlamaForCausalLM(cfg).eval()
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    draft.load_state_dict(state, strict=False)
    if noise:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in draft.named_parameters():
                if "layers." in name:
                    p.add_(noise * p.std() * torch.randn(p.shape, generator=gen))
    draft.save_pretrained(path)
    return path


def save_tiny_pair(root: Path, *, seed: int, draft_layers: int = 1, noise: float = 0.05) -> tuple[Path, Path]:
    """(target, draft) under root: a 2-layer, 256-token tiny target and a draft from its first layers."""
    target = save_tiny_llama(root / "target", vocab=256, layers=2, seed=seed)
    return target, save_draft_from(target, root / "draft", layers=draft_layers, noise=noise)


def hf_model(path: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def save_feature_head(target_dir: Path, path: Path, *, inner: int = 64, blocks: int = 2, scale: float = 0.5,
                      seed: int = 2) -> Path:
    """A random feature-head draft for a target (recipes/demo/train_draft_head.py's module, its blocks'
    output weights scaled by `scale`): it steps the target's state a little, so its proposals are near the
    target's previous distribution and agree with the next one sometimes."""
    from pcgtts.engine.model.feature_head import FeatureHeadConfig
    from pcgtts.recipes.demo.train_draft_head import FeatureHeadModule, export_head

    target = hf_model(target_dir)
    cfg = FeatureHeadConfig(hidden_size=target.config.hidden_size, intermediate_size=inner, num_blocks=blocks,
                            vocab_size=target.config.vocab_size, rms_norm_eps=target.config.rms_norm_eps)
    torch.manual_seed(seed)
    head = FeatureHeadModule(cfg, target.model.embed_tokens.weight)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("down.weight"):
                p.copy_(scale * torch.randn_like(p) / p.shape[1] ** 0.5)
            elif "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    export_head(head, path)
    return path
