"""Llama decoder (RMSNorm, RoPE, GQA, SwiGLU, tied or untied head) running over a paged KV cache.

Weights are plain tensors with q/k/v and gate/up fused into one matrix each, so a layer is three big
matmuls plus attention; on CPU each projection keeps its matrix input-major (`Projection`). Numerics
follow Hugging Face's `LlamaForCausalLM` (RMSNorm in float32, rotate-half RoPE, cos/sin in the model
dtype); eager CPU fp32 models use equivalent forms with fewer ops (loader.few_op_forms: interleaved RoPE,
RMSNorm as a layer norm), equal to float32 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pcgtts.engine.attention import AttentionBackend, PagedBatch
from pcgtts.engine.kv_cache import KVCache
from pcgtts.engine.model.config import LlamaConfig
from pcgtts.engine.model.rope import RotaryEmbedding


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # torch's fused op: the same numbers as the lines below (checked bit for bit in tests) in one call
        return F.rms_norm(x, weight.shape, weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm:
    """Hugging Face's RMSNorm, weight · x / sqrt(mean(x²) + eps), computed in float32.

    With `layer_norm_form` (CPU, float32, eager: the loader's `few_op_forms`), decode-sized inputs (at
    most `LAYER_NORM_MAX_ROWS` rows) run as one `layer_norm` over [x, -x]: that row has mean 0 and variance
    mean(x²), so layer norm's output over its first half is RMSNorm's, from torch's single fused CPU
    kernel, where `F.rms_norm` is half a dozen small ops (agrees to float32 rounding, not bit for bit;
    tested). Larger inputs (prefill) take `rms_norm`. The result may be a strided view ([..., :d] of
    [..., 2d])."""

    LAYER_NORM_MAX_ROWS = 64

    def __init__(self, weight: torch.Tensor, eps: float, layer_norm_form: bool = False):
        self.weight, self.eps = weight, eps  # [d]
        self.dim = weight.shape[0]
        self.layer_norm_weight = None  # [2d]: weight, then zeros (the mirrored half is dropped)
        if layer_norm_form and weight.dtype == torch.float32:
            self.layer_norm_weight = torch.cat([weight, torch.zeros_like(weight)])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d] -> [..., d]."""
        d = self.dim
        small = x.numel() <= self.LAYER_NORM_MAX_ROWS * d
        if self.layer_norm_weight is None or x.dtype != torch.float32 or not small:
            return rms_norm(x, self.weight, self.eps)
        mirrored = torch.cat([x, x.neg()], dim=-1)  # [..., 2d]
        return F.layer_norm(mirrored, (2 * d,), self.layer_norm_weight, None, self.eps)[..., :d]


class Projection:
    """y = x Wᵀ + b for a checkpoint matrix W [out, in].

    On CPU W is stored transposed, input-major ([in, out], contiguous), and applied as x @ W: MKL's GEMM
    for the few rows of a decode or verify forward (1-64) runs faster on that layout than on x @ Wᵀ
    (`F.linear`), and no slower for prefill-sized inputs. Elsewhere (CUDA) `F.linear`.
    `copy=False` keeps W as given (F.linear): a tied head shares its matrix with the embedding."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, copy: bool = True):
        self.input_major = copy and weight.device.type == "cpu"
        self.weight = weight.t().contiguous() if self.input_major else weight  # [in, out] or [out, in]
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        if not self.input_major:
            return F.linear(x, self.weight, self.bias)
        y = torch.matmul(x, self.weight)
        return y if self.bias is None else y.add_(self.bias)


@dataclass
class LayerWeights:
    input_norm: RMSNorm  # [d]
    qkv: Projection  # d -> (H + 2 H_kv) D
    o: Projection  # H D -> d
    post_norm: RMSNorm  # [d]
    gate_up: Projection  # d -> 2 I
    down: Projection  # I -> d


class LlamaModel:
    def __init__(self, cfg: LlamaConfig, embed: torch.Tensor, layers: list[LayerWeights],
                 final_norm: RMSNorm, lm_head: Projection, max_positions: int,
                 interleaved_rope: bool = False):
        """interleaved_rope: the q/k rows of every layer's qkv are in interleaved-pair order (rope.py)."""
        self.cfg = cfg
        self.embed = embed  # [V, d]
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head  # d -> V; over the same tensor as `embed` when tied
        self.device, self.dtype = embed.device, embed.dtype
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, max_positions,
                                    self.device, self.dtype, interleaved=interleaved_rope)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: PagedBatch, cache: KVCache,
                backend: AttentionBackend) -> torch.Tensor:
        """input_ids Long[B, T] at meta.positions -> final hidden states [B, T, d]; writes K/V."""
        return self.hidden_states(input_ids, meta, cache, backend)

    def hidden_states(self, input_ids: torch.Tensor, meta: PagedBatch, cache: KVCache,
                      backend: AttentionBackend) -> torch.Tensor:
        """`forward` without its inference_mode wrapper (what graph capture traces)."""
        cfg = self.cfg
        b, t = input_ids.shape
        x = F.embedding(input_ids, self.embed)  # [B, T, d]
        rotation = self.rope.lookup(meta.positions)
        qk_size = self.q_size + self.kv_size
        for i, w in enumerate(self.layers):
            h = w.input_norm(x)
            qkv = w.qkv(h)  # [B, T, (H + 2 H_kv) D]
            # q and k rotated together: one set of elementwise ops for all their heads
            qk = qkv[..., :qk_size].view(b, t, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim)
            q, k = self.rope.rotate(qk, rotation).split([cfg.num_heads, cfg.num_kv_heads], dim=2)
            v = qkv[..., qk_size:].view(b, t, cfg.num_kv_heads, cfg.head_dim)
            k_cache, v_cache = cache.layer(i)
            attn = backend.attend(q, k, v, k_cache, v_cache, meta, i)  # [B, T, H D]
            x = x + w.o(attn)
            h = w.post_norm(x)
            gate, up = w.gate_up(h).chunk(2, dim=-1)
            x = x + w.down(F.silu(gate) * up)
        return self.final_norm(x)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> float32 logits [..., V]."""
        logits = self.lm_head(hidden)
        return logits if logits.dtype == torch.float32 else logits.float()
