"""Llama decoder (RMSNorm, RoPE, GQA, SwiGLU, tied or untied head) running over a paged KV cache.

Weights are plain tensors with q/k/v and gate/up fused into one matrix each, so a layer is three big
matmuls plus attention; on CPU each projection keeps its matrix input-major (`Projection`). Numerics
follow Hugging Face's `LlamaForCausalLM` (RMSNorm in float32, rotate-half RoPE, cos/sin in the model
dtype); eager CPU fp32 models use equivalent forms with fewer ops (loader.few_op_forms: interleaved RoPE,
RMSNorm as a layer norm), equal to float32 rounding.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pcgtts.engine.attention import AttentionBackend, PagedBatch
from pcgtts.engine.batch_invariance import InvariancePlan, pad_rows
from pcgtts.engine.kv_cache import KVCache
from pcgtts.engine.model.config import LlamaConfig
from pcgtts.engine.model.rope import RotaryEmbedding
from pcgtts.engine.ops.rms_norm import RMS_NORM


class RMSNorm:
    """Hugging Face's RMSNorm, weight · x / sqrt(mean(x²) + eps), computed in float32.

    With `layer_norm_form` (CPU, float32, eager: the loader's `few_op_forms`), decode-sized inputs (at
    most `LAYER_NORM_MAX_ROWS` rows) run as one `layer_norm` over [x, -x]: that row has mean 0 and variance
    mean(x²), so layer norm's output over its first half is RMSNorm's, from torch's single fused CPU
    kernel, where `F.rms_norm` is half a dozen small ops (agrees to float32 rounding, not bit for bit;
    tested). Larger inputs (prefill) take `rms_norm`, and so does every input once `row_invariant` is set
    (engine/batch_invariance.py: a position then rounds alike in a prefill and in a decode step). The
    result may be a strided view ([..., :d] of [..., 2d]).

    With `compiled` (set by the engine where its compiled CPU ops run these float32 eager forwards) every
    input takes the compiled loop instead (engine/ops/rms_norm.py): a few µs where either torch call costs
    30-40, and a row's bits whatever the row count, so it serves plans too."""

    LAYER_NORM_MAX_ROWS = 64

    def __init__(self, weight: torch.Tensor, eps: float, layer_norm_form: bool = False):
        self.weight, self.eps = weight, eps  # [d]
        self.dim = weight.shape[0]
        self.layer_norm_weight = None  # [2d]: weight, then zeros (the mirrored half is dropped)
        if layer_norm_form and weight.dtype == torch.float32:
            self.layer_norm_weight = torch.cat([weight, torch.zeros_like(weight)])
        self.row_invariant = False
        self.compiled = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d] -> [..., d]."""
        if self.compiled:
            return RMS_NORM.compiled(x, self.weight, self.eps)
        d = self.dim
        small = x.numel() <= self.LAYER_NORM_MAX_ROWS * d
        if self.layer_norm_weight is None or x.dtype != torch.float32 or not small or self.row_invariant:
            return RMS_NORM.torch(x, self.weight, self.eps)
        mirrored = torch.cat([x, x.neg()], dim=-1)  # [..., 2d]
        return F.layer_norm(mirrored, (2 * d,), self.layer_norm_weight, None, self.eps)[..., :d]


# Fewest rows a product takes from the fp16 copy of its weights: for one row MKL's fp32 product is faster
# (measured on the 2-core build machines: 0.74x for one row, 1.5-1.9x for 2-16 rows, 1.1x for 64)
HALF_MIN_ROWS = 2


def fbgemm_available() -> bool:
    """fbgemm's GEMMs (fp16 weights, dynamic int8) run here (x86 with AVX2 or better)."""
    return ("fbgemm" in torch.backends.quantized.supported_engines
            and torch.backends.cpu.get_cpu_capability() != "DEFAULT")


# Fewest rows a product takes from the bf16 copy of its weights (use_bf16_weights) outside a batch-invariance
# plan: below, the input's rounding and oneDNN's per-call set-up cost more than the tiles save
# (bench/results/bf16-weights/)
BF16_MIN_ROWS = 16
# Most rows one oneDNN bf16 call multiplies, and the calls the engine's start-up check of a projection's
# rows covers (batch_invariance.invariant_anywhere): past 128 rows the 688 -> 256 product also changed
# blocking with the count (bench/results/bf16-seeded/); larger inputs are multiplied in calls of this many
BF16_CALL_ROWS = 128


# Fewest rows a product takes from the int8 copy of its weights (use_int8_weights) outside a batch-invariance
# plan: from 8 rows the products ran 1.25-1.56x faster than fp16's; a forward of 6 rows gained nothing
# measurable (1.00-1.05x) and batch-1 PCG decodes, through 4-row verify forwards, measured 0.90-0.99x
# (bench/results/int8-weights/)
INT8_MIN_ROWS = 8


def onednn_bf16_native() -> bool:
    """oneDNN multiplies bf16 natively here: AMX tiles or AVX512-BF16 dot products (else it would emulate
    bf16 in fp32, slower than the fp32 product)."""
    return torch.backends.mkldnn.is_available() and (torch.cpu._is_amx_tile_supported()
                                                     or torch.cpu._is_avx512_bf16_supported())


def resolve_cpu_weights(setting: str) -> str:
    """EngineConfig.cpu_weights as the engine applies it: "auto" is bf16 where oneDNN multiplies on AMX tiles
    (the CPU bf16 was measured on: faster at batch, quality within the noise, bench/results/bf16-weights/),
    else fp16 (AVX512-BF16 without AMX is unmeasured: `bf16` opts in)."""
    if setting != "auto":
        return setting
    return "bf16" if torch.backends.mkldnn.is_available() and torch.cpu._is_amx_tile_supported() else "fp16"


class Projection:
    """y = x Wᵀ + b for a checkpoint matrix W [out, in].

    On CPU W is stored transposed, input-major ([in, out], contiguous), and applied as x @ W: MKL's GEMM
    for the few rows of a decode or verify forward (1-64) runs faster on that layout than on x @ Wᵀ
    (`F.linear`), and no slower for prefill-sized inputs. Elsewhere (CUDA) `F.linear`.
    `copy=False` keeps W as given (F.linear): a tied head shares its matrix with the embedding.

    `use_half_weights` adds an fp16 copy of W for products of HALF_MIN_ROWS rows or more, where W's values
    are exactly fp16 (an fp16 checkpoint loaded in float32): fbgemm's GEMM widens the fp16 weights in
    registers and sums in float32, so the numbers are those of the same weights, rounded as another
    float32 GEMM rounds. At a decode's few rows the product streams its weights from memory once per
    forward, and half the bytes is most of the gain."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, copy: bool = True):
        self.input_major = copy and weight.device.type == "cpu"
        self.weight = weight.t().contiguous() if self.input_major else weight  # [in, out] or [out, in]
        self.bias = bias
        self.half = None  # fbgemm's packed fp16 copy of W and b (use_half_weights), or None
        self.bf16 = None  # oneDNN's packed bf16 copy of W (use_bf16_weights), or None
        self.int8 = None  # fbgemm's packed int8 copy of W (use_int8_weights), or None
        self.bf16_min_rows = BF16_MIN_ROWS
        self.invariant = False  # under an active batch-invariance plan
        # oneDNN computes this product's rows alike at every count up to BF16_CALL_ROWS (measured by the
        # engine, batch_invariance.invariant_anywhere): plans with bf16 products may take the copy
        self.bf16_invariant = False
        self.bf16_in_plan = False  # under the plan now, the bf16 copy at every row count
        # inputs are padded with zero rows to a multiple of this many (engine/batch_invariance.py: the GEMM
        # kernel then computes every row alike whatever the row count); 1 = never
        self.row_quantum = 1

    def use_half_weights(self) -> bool:
        """Multiply from an fp16 copy of W where that loses nothing (CPU float32, input-major, every value
        exactly fp16) and fbgemm runs here; whether it does now."""
        if not self.input_major or self.weight.dtype != torch.float32 or not fbgemm_available():
            return False
        w = self.weight.t()  # [out, in]
        if not torch.equal(w.half().float(), w):
            return False
        self.half = torch.ops.quantized.linear_prepack_fp16(w.contiguous(), self.bias)
        return True

    def use_bf16_weights(self) -> bool:
        """Multiply products of `bf16_min_rows` rows or more from a bf16 copy of W through oneDNN (AMX tiles
        where the CPU has them): inputs rounded to bf16, sums in float32, the product rounded to bf16
        (oneDNN's CPU product returns bf16). Not the checkpoint's numbers (W loses 3 mantissa bits, x and
        y 16), so a setting whose quality is measured. Under a batch-invariance plan that found oneDNN's
        rows invariant (InvariancePlan.bf16_products, `bf16_invariant`) every row count takes the copy, in
        calls of at most BF16_CALL_ROWS rows; otherwise the checkpoint's weights. Where oneDNN multiplies bf16
        natively; whether it does now."""
        if not self.input_major or self.weight.dtype != torch.float32 or not onednn_bf16_native():
            return False
        w = self.weight.t().contiguous().bfloat16()  # [out, in], what oneDNN's linear packs
        self.bf16 = torch.ops.mkldnn._reorder_linear_weight(w, 64)
        return True

    def use_int8_weights(self) -> bool:
        """Multiply products of INT8_MIN_ROWS rows or more in steps outside a batch-invariance plan from an
        int8 copy of W through fbgemm's dynamic int8 GEMM: each output channel of W rounded to 255 levels
        (symmetric, step max|W_row| / 127), the input rounded at each call to 128 levels between its min and
        max (fbgemm's AVX2 kernel keeps inputs to 7 bits so that its u8 x s8 pair sums cannot saturate),
        products summed in int32 and scaled back to float32. Not the checkpoint's numbers: a setting whose
        quality is measured (bench/results/int8-weights/). One call's rows share the input's range, so a
        row's rounding depends on its batch mates: never under a plan (seeded and greedy steps, prefills),
        whose rows must be alike whatever shares the forward. Where fbgemm runs; whether it does now."""
        if not self.input_major or self.weight.dtype != torch.float32 or not fbgemm_available():
            return False
        w = self.weight.t().contiguous()  # [out, in]
        step = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)  # [out]
        with warnings.catch_warnings():  # torch deprecates quantized tensors; fbgemm's packing takes one
            warnings.simplefilter("ignore", UserWarning)
            q = torch.quantize_per_channel(w, step.double(), torch.zeros_like(step, dtype=torch.long), 0,
                                           torch.qint8)
            self.int8 = torch.ops.quantized.linear_prepack(q, None)
        return True

    def apply_plan(self, plan: InvariancePlan) -> None:
        """Rows padded to the plan's quantum; under an active plan one product kind at every row count: the
        bf16 copy where the plan found it invariant, else the checkpoint's weights."""
        self.row_quantum, self.invariant = plan.row_quantum, plan.active
        self.bf16_in_plan = plan.active and plan.bf16_products and self.bf16_invariant

    @property
    def in_features(self) -> int:
        return self.weight.shape[0 if self.input_major else 1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out], as one GEMM over all rows: a 3-D input that cannot be viewed as rows
        (e.g. attention's output sliced from padded queries) would otherwise run as a batched product of
        one-row GEMMs, each row by the kernel of a one-row product."""
        rows = x.numel() // x.shape[-1]
        # a bf16 product under the plan computes rows alike at any count (bf16_invariant): nothing to pad
        quantum = 1 if self.bf16_in_plan else self.row_quantum
        y = self.product(pad_rows(x.reshape(rows, x.shape[-1]), quantum))
        return y[:rows].view(*x.shape[:-1], y.shape[-1])

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """The matrix product alone, rows as given."""
        if self.int8 is not None and not self.invariant and x.shape[0] >= INT8_MIN_ROWS:
            y = torch.ops.quantized.linear_dynamic(x, self.int8, True)  # True: 7-bit inputs (AVX2, above)
            return y if self.bias is None else y.add_(self.bias)
        if self.bf16 is None:
            return self.weights_product(x)
        if self.bf16_in_plan if self.invariant else x.shape[0] >= self.bf16_min_rows:
            return self.bf16_product(x)
        return self.weights_product(x)

    def bf16_product(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, in] -> [R, out] through the bf16 copy (use_bf16_weights), BF16_CALL_ROWS rows per call at
        most: what batch_invariance.calibrate measures for a plan with bf16 products."""
        def call(rows: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(rows.bfloat16(), self.bf16, None, "none", [], "")

        y = call(x) if x.shape[0] <= BF16_CALL_ROWS else torch.cat([call(c) for c in x.split(BF16_CALL_ROWS)])
        y = y.float()
        return y if self.bias is None else y.add_(self.bias)

    def weights_product(self, x: torch.Tensor) -> torch.Tensor:
        """The product over the checkpoint's own weight values (their fp16 copy or float32), rows as given:
        what batch-invariant forwards take (but for projections a plan with bf16 products sends through
        their copy) and batch_invariance.calibrate measures."""
        if self.half is not None and x.shape[0] >= HALF_MIN_ROWS:
            return torch.ops.quantized.linear_dynamic_fp16(x, self.half)
        if not self.input_major:
            return F.linear(x, self.weight, self.bias)
        y = torch.matmul(x, self.weight)
        return y if self.bias is None else y.add_(self.bias)


def _unpack_rows(rows: torch.Tensor, packed: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """rows [N, C] of the real tokens at flat indices Long[N] -> [B, T, C], padding tokens zeros."""
    return rows.new_zeros(b * t, rows.shape[-1]).index_copy_(0, packed, rows).view(b, t, rows.shape[-1])


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

    def apply_plan(self, plan: InvariancePlan) -> None:
        """Pad every projection's rows to the plan's quantum and keep RMSNorm in one form
        (engine/batch_invariance.py)."""
        for proj in self.projections():
            proj.apply_plan(plan)
        for w in self.layers:
            w.input_norm.row_invariant = w.post_norm.row_invariant = plan.active
        self.final_norm.row_invariant = plan.active

    def projections(self) -> list[Projection]:
        """Every matrix product of the forward, the LM head last."""
        return [p for w in self.layers for p in (w.qkv, w.o, w.gate_up, w.down)] + [self.lm_head]

    def int8_projections(self) -> list[Projection]:
        """The products an int8 copy may serve (EngineConfig.cpu_weights "int8"): those whose inputs have
        one range across their entries, a normed residual (qkv, gate_up) or attention's output (o), where
        128 input levels keep the product within about 1% (relative error against the fp16 weights'
        product in a batch-16 decode of the bundle). Not `down`, whose input silu(gate)·up has a few large
        entries per row that leave the rest a handful of levels (6-11%), nor the LM head, where rounding
        moves the sampling distribution itself."""
        return [p for w in self.layers for p in (w.qkv, w.o, w.gate_up)]

    def norms(self) -> list[RMSNorm]:
        """Every RMSNorm of the forward, the final one last."""
        return [n for w in self.layers for n in (w.input_norm, w.post_norm)] + [self.final_norm]

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
        packed = meta.packed  # Long[N] real tokens' flat indices into B*T, or None (every token real)
        if packed is None:
            x = F.embedding(input_ids, self.embed)  # [B, T, d]
        else:  # the residual stream and the products over the N real tokens only: x [N, d]
            x = F.embedding(input_ids.reshape(-1).index_select(0, packed), self.embed)
        # the backend rotates q and k as it writes the K/V (one compiled loop on the CPU's rows path)
        fused_rope = self.rope.interleaved and x.dtype == torch.float32 and backend.fuses_rope(meta)
        rotation = None if fused_rope else self.rope.lookup(meta.positions)
        qk_size = self.q_size + self.kv_size
        for i, w in enumerate(self.layers):
            h = w.input_norm(x)
            qkv = w.qkv(h)  # [B, T, (H + 2 H_kv) D]
            if packed is not None:  # attention takes its [B, T] layout (padding tokens zeros)
                qkv = _unpack_rows(qkv, packed, b, t)
            k_cache, v_cache = cache.layer(i)
            if fused_rope:
                attn = backend.attend_unrotated(qkv, self.rope, cfg.num_heads, cfg.num_kv_heads, k_cache,
                                                v_cache, meta, i)
            else:
                # q and k rotated together: one set of elementwise ops for all their heads
                qk = qkv[..., :qk_size].view(b, t, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim)
                q, k = self.rope.rotate(qk, rotation).split([cfg.num_heads, cfg.num_kv_heads], dim=2)
                v = qkv[..., qk_size:].view(b, t, cfg.num_kv_heads, cfg.head_dim)
                attn = backend.attend(q, k, v, k_cache, v_cache, meta, i)  # [B, T, H D]
            if packed is not None:
                attn = attn.reshape(b * t, attn.shape[-1]).index_select(0, packed)  # [N, H D]
            x = x + w.o(attn)
            h = w.post_norm(x)
            gate, up = w.gate_up(h).chunk(2, dim=-1)
            x = x + w.down(F.silu(gate) * up)
        x = self.final_norm(x)
        return x if packed is None else _unpack_rows(x, packed, b, t)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> float32 logits [..., V]."""
        logits = self.lm_head(hidden)
        return logits if logits.dtype == torch.float32 else logits.float()
