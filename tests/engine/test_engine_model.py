"""The engine's Llama matches transformers' LlamaForCausalLM logits on the same checkpoint (fp32)."""

from __future__ import annotations

import pytest
import torch
from engine_support import DEVICE, hf_model, save_tiny_llama
from pcgtts.engine.attention import make_backend
from pcgtts.engine.block_manager import SeqBlocks
from pcgtts.engine.model.config import LlamaConfig
from pcgtts.engine.model.loader import load_llama
from pcgtts.engine.model_runner import ModelRunner

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
CASES = {
    "gqa-untied": dict(heads=4, kv_heads=2, tie=False),
    "mha-tied": dict(heads=4, kv_heads=4, tie=True),
    "mqa-llama3-rope": dict(heads=4, kv_heads=1, tie=False, rope_scaling=LLAMA3_ROPE),
    "linear-rope": dict(heads=2, kv_heads=2, tie=True, rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


def engine_logits(path, prompts: list[list[int]], chunk: int, block_size: int = 4, backend: str = "sdpa",
                  dtype: str = "float32") -> list[torch.Tensor]:
    """Logits of every prompt position, fed `chunk` tokens per forward for all prompts at once."""
    model = load_llama(path, DEVICE, dtype)
    runner = ModelRunner(model, num_blocks=64, block_size=block_size,
                         backend=make_backend(backend, DEVICE, model.dtype, block_size))
    states = [SeqBlocks() for _ in prompts]
    for st, p in zip(states, prompts, strict=True):
        st.ensure(runner.blocks, len(p))
    outs = [[] for _ in prompts]
    for start in range(0, max(len(p) for p in prompts), chunk):
        live = [i for i, p in enumerate(prompts) if start < len(p)]
        chunks = [prompts[i][start:start + chunk] for i in live]
        hidden = runner.forward_chunks([states[i] for i in live], chunks)
        logits = runner.logits(hidden)
        for row, i in enumerate(live):
            outs[i].append(logits[row, logits.shape[1] - len(chunks[row]):].cpu())  # left-padded rows
    return [torch.cat(o) for o in outs]


@pytest.mark.parametrize("few_ops", [True, False], ids=["few-op-forms", "checkpoint-forms"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path, monkeypatch, case, few_ops):
    """Both sets of forms (loader.few_op_forms: interleaved RoPE and layer-norm RMSNorm, the CPU fp32 eager
    default, and the checkpoint's own forms used elsewhere) give Hugging Face's logits."""
    import pcgtts.engine.model.loader as loader

    monkeypatch.setattr(loader, "few_op_forms", lambda *_: few_ops)
    path = save_tiny_llama(tmp_path / case, vocab=300, layers=2, seed=3, **CASES[case])
    model = load_llama(path, DEVICE, "float32")
    assert model.rope.interleaved == few_ops and (model.final_norm.layer_norm_weight is not None) == few_ops
    hf = hf_model(path)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (29, 5, 70)]
    with torch.no_grad():
        expected = [hf(torch.tensor([p])).logits[0] for p in prompts]
    # all at once (prefill), then in ragged chunks of 7 (padding, partial blocks), then token by token
    for chunk in (128, 7, 1):
        got = engine_logits(path, prompts, chunk)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    assert (expected[2][50:] - expected[2][50:].mean(-1, keepdim=True)).abs().max() > 0.1  # not degenerate


def test_sharded_and_half_precision_checkpoints(tmp_path):
    from transformers import LlamaForCausalLM

    path = save_tiny_llama(tmp_path / "full", vocab=300, layers=2, seed=5)
    hf = hf_model(path)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="100KB")
    assert len(list(sharded.glob("*.safetensors"))) > 1
    prompt = list(range(10, 40))
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(engine_logits(sharded, [prompt], 64)[0], expected, rtol=1e-4, atol=1e-4)

    bf16 = tmp_path / "bf16"
    LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(bf16)
    assert LlamaConfig.from_dir(bf16).checkpoint_dtype == torch.bfloat16
    model = load_llama(bf16, "cpu", "auto")
    assert model.dtype == torch.float32  # "auto" computes in fp32 on CPU
    got = engine_logits(bf16, [prompt], 64)[0]
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()  # bf16 weights: close, not equal
    half = load_llama(path, "cpu", "bfloat16")
    assert half.embed.dtype == torch.bfloat16


def _flash_attn_usable() -> bool:
    import importlib.util

    return DEVICE.startswith("cuda") and importlib.util.find_spec("flash_attn") is not None


@pytest.mark.skipif(not _flash_attn_usable(), reason="needs PCGTTS_TEST_DEVICE=cuda and flash-attn")
def test_flash_attn_backend_matches_sdpa(tmp_path):
    path = save_tiny_llama(tmp_path / "m", vocab=300, hidden=128, heads=4, kv_heads=2, layers=2, seed=9)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (300, 5, 90)]
    for chunk in (512, 7, 1):
        flash = engine_logits(path, prompts, chunk, block_size=256, backend="flash_attn", dtype="bfloat16")
        sdpa = engine_logits(path, prompts, chunk, block_size=256, backend="sdpa", dtype="bfloat16")
        for f, s in zip(flash, sdpa, strict=True):
            assert (f - s).abs().max() < 0.05 * s.abs().max()


def test_fused_float32_rms_norm_equals_the_reference_formula():
    """rms_norm's float32 path calls torch's fused op; it must give Hugging Face's formula bit for bit."""
    from pcgtts.engine.ops.rms_norm import rms_norm_torch as rms_norm

    torch.manual_seed(0)
    for shape in [(1, 1, 256), (12, 4, 256), (3, 300, 64)]:
        x, w = torch.randn(*shape) * 3, torch.randn(shape[-1])
        reference = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        assert torch.equal(rms_norm(x, w, 1e-6), reference)


def test_projection_equals_linear_in_both_layouts_and_keeps_a_tied_matrix_shared():
    """Projection stores W input-major on CPU (x @ W, MKL's faster small-row GEMM) and must compute
    F.linear's x Wᵀ + b (to fp32 rounding) for decode-, verify- and prefill-sized inputs; copy=False keeps
    the given matrix itself (a tied head reads the embedding, no second copy)."""
    from pcgtts.engine.model.llama import Projection

    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64), torch.randn(96)
    for proj in (Projection(weight, bias), Projection(weight, bias, copy=False), Projection(weight)):
        assert proj.input_major == (proj.weight is not weight)
        for shape in [(1, 1, 64), (6, 4, 64), (2, 300, 64)]:
            x = torch.randn(*shape)
            expected = torch.nn.functional.linear(x, weight, proj.bias)
            torch.testing.assert_close(proj(x), expected, rtol=1e-5, atol=1e-5)
    assert Projection(weight).input_major and Projection(weight).weight.shape == (64, 96)
    tied = Projection(weight, copy=False)
    assert tied.weight.data_ptr() == weight.data_ptr()


@pytest.mark.skipif(not __import__("pcgtts.engine.model.llama", fromlist=["x"]).fbgemm_available(),
                    reason="fbgemm's fp16 GEMM needs x86 with AVX2")
def test_half_weights_only_where_exact_and_products_agree_with_fp32():
    """An fp16 copy of W is made only when every value of W is exactly fp16 (input-major CPU float32):
    then products of 2 rows or more (decode batches, verify rows, prefill chunks, with a bias, from a
    strided input) agree with F.linear to float32 rounding, and one-row products stay MKL's, bit for bit.
    A matrix with one value off the fp16 grid, a tied head (W as given) and fp16 compute keep theirs."""
    from pcgtts.engine.model.llama import HALF_MIN_ROWS, Projection

    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64).half().float(), torch.randn(96)
    proj, fp32 = Projection(weight, bias), Projection(weight, bias)
    assert proj.use_half_weights() and proj.half is not None and fp32.half is None
    for shape in [(1, 1, 64), (HALF_MIN_ROWS, 1, 64), (6, 4, 64), (2, 300, 64)]:
        x = torch.randn(*shape)
        expected = torch.nn.functional.linear(x, weight, bias)
        torch.testing.assert_close(proj(x), expected, rtol=1e-5, atol=1e-5)
        if x.numel() // 64 < HALF_MIN_ROWS:
            assert torch.equal(proj(x), fp32(x))
    strided = torch.randn(5, 128)[:, :64]  # RMSNorm's layer-norm form returns such views
    torch.testing.assert_close(proj(strided), torch.nn.functional.linear(strided, weight, bias),
                               rtol=1e-5, atol=1e-5)
    off_grid = weight.clone()
    off_grid[3, 7] += 1e-4  # between two fp16 values
    assert not Projection(off_grid).use_half_weights()
    assert not Projection(weight, copy=False).use_half_weights()
    assert not Projection(weight.half()).use_half_weights()


@pytest.mark.skipif(not __import__("pcgtts.engine.model.llama", fromlist=["x"]).onednn_bf16_native(),
                    reason="oneDNN multiplies bf16 natively only with AMX or AVX512-BF16")
def test_bf16_products_at_batch_round_inputs_and_weights_and_under_a_plan_only_where_rows_stay_alike():
    """A bf16 copy of W serves products of BF16_MIN_ROWS rows or more: each is the float32 product of the
    bf16-rounded inputs and weights, rounded to bf16, and differs from the float32 product by those
    roundings; fewer rows are the checkpoint weights' product bit for bit. Under an active batch-invariance
    plan one kind serves every row count: the bf16 copy (in calls of at most BF16_CALL_ROWS rows) where the
    plan has bf16 products and this projection's rows were found invariant, else the checkpoint weights'.
    A tied head (W as given) and fp16 compute make no copy."""
    from pcgtts.engine.batch_invariance import PLAIN, InvariancePlan
    from pcgtts.engine.model.llama import BF16_CALL_ROWS, BF16_MIN_ROWS, Projection

    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64).half().float(), torch.randn(96)
    proj = Projection(weight, bias)
    assert proj.use_bf16_weights() and proj.bf16 is not None
    for rows in [1, BF16_MIN_ROWS - 1, BF16_MIN_ROWS, 64, 300]:
        x = torch.randn(rows, 64)
        if rows < BF16_MIN_ROWS:
            assert torch.equal(proj(x), proj.weights_product(x))
            continue
        # oneDNN's bf16 product returns bf16: the float32 sum, rounded to bf16 (within one bf16 step of
        # the float32 sum taken in another order), then the bias in float32
        rounded = torch.nn.functional.linear(x.bfloat16().float(), weight.bfloat16().float())
        torch.testing.assert_close(proj(x) - bias, rounded, rtol=2 ** -7, atol=1e-5)
        exact = torch.nn.functional.linear(x, weight, bias)
        assert (proj(x) - exact).abs().max() > 1e-3  # the rounding is there: this is not the fp32 product
        proj.apply_plan(InvariancePlan(row_quantum=4, key_tile=512))
        assert torch.equal(proj(x), proj.weights_product(x))
        proj.apply_plan(PLAIN)
    with_bf16 = InvariancePlan(row_quantum=4, key_tile=512, bf16_products=True)
    x = torch.randn(2 * BF16_CALL_ROWS + 8, 64)
    calls = [proj.bf16_product(part) for part in x.split(BF16_CALL_ROWS)]
    for invariant in (True, False):
        proj.bf16_invariant = invariant
        proj.apply_plan(with_bf16)
        for rows in (4, 8, len(x)):  # every row count takes one kind; long inputs in calls of 128 rows
            expected = torch.cat(calls)[:rows] if invariant else proj.weights_product(x[:rows])
            assert torch.equal(proj(x[:rows]), expected), (invariant, rows)
    proj.apply_plan(PLAIN)
    assert not Projection(weight, copy=False).use_bf16_weights()
    assert not Projection(weight.half()).use_bf16_weights()


def _weights_engines(tmp_path):
    """What the reduced-weights engine tests share: an engine factory over an fp16 target (2 layers, vocab
    256) and a noisy 1-layer draft at γ 3, taking a `cpu_weights` setting; six prompts and their seeded
    params."""
    from engine_support import engine_config, save_draft_from
    from pcgtts.engine import Engine, SamplingParams

    target = save_tiny_llama(tmp_path / "target", vocab=256, layers=2, seed=3, dtype=torch.float16)
    draft = save_draft_from(target, tmp_path / "draft", layers=1, noise=0.05)
    prompts = [[3 + i, 4, 5 + i] for i in range(6)]
    seeded = [SamplingParams(temperature=1.0, max_tokens=30, seed=50 + i) for i in range(6)]

    def engine(weights):
        return Engine(engine_config(target, draft=draft, num_speculative_tokens=3, cpu_weights=weights))

    return engine, prompts, seeded


@pytest.mark.skipif(not __import__("pcgtts.engine.model.llama", fromlist=["x"]).onednn_bf16_native(),
                    reason="oneDNN multiplies bf16 natively only with AMX or AVX512-BF16")
def test_bf16_engine_takes_bf16_in_seeded_steps_only_where_oneDNN_keeps_rows_alike(tmp_path):
    """cpu_weights="bf16": every projection but the LM heads (logits keep float32 sums) gets a bf16 copy;
    at start-up the engine marks those whose bf16 rows come out alike in any call of up to BF16_CALL_ROWS
    rows, wherever they sit (measured again here), and its batch-invariance plan has bf16 products iff
    some are. Seeded requests give the same tokens one at a time as together (6 x (γ+1) = 24 rows a verify
    forward, what takes bf16 outside a plan); unseeded, the same batch decodes through the bf16 copies
    (its logits move by bf16's rounding)."""
    from pcgtts.engine.batch_invariance import PLAIN, invariant_anywhere, random_rows
    from pcgtts.engine.model.llama import BF16_CALL_ROWS, BF16_MIN_ROWS

    engine, prompts, seeded = _weights_engines(tmp_path)

    bf16, fp16 = engine("bf16"), engine("fp16")
    # the default, "auto", takes them where oneDNN has AMX tiles (the CPU they were measured on)
    assert (engine("auto").bf16_weight_products > 0) == torch.cpu._is_amx_tile_supported()
    heads = [bf16.target.model.lm_head, bf16.draft.model.lm_head]
    assert all(p.bf16 is None for p in heads) and fp16.bf16_weight_products == 0
    assert bf16.bf16_weight_products == len(bf16._projections()) - len(heads) > 0
    copies = [p for p in bf16._projections() if p.bf16 is not None]
    for p in copies:
        x = random_rows(BF16_CALL_ROWS, p.in_features, bf16.device, bf16.dtype)
        assert p.bf16_invariant == invariant_anywhere(p.bf16_product, x)
    assert bf16.invariance.bf16_products == any(p.bf16_invariant for p in copies)
    assert not fp16.invariance.bf16_products
    assert bf16.invariance.active and 6 * 4 >= BF16_MIN_ROWS
    one_at_a_time = [bf16.generate([prompt], [params])[0].token_ids
                     for prompt, params in zip(prompts, seeded, strict=True)]
    assert [g.token_ids for g in bf16.generate(prompts, seeded)] == one_at_a_time
    qkv = bf16.target.model.layers[0].qkv
    qkv.apply_plan(PLAIN)  # an unseeded step's shape
    x = torch.randn(6 * 4, qkv.in_features)
    assert not torch.equal(qkv(x), qkv.weights_product(x))


@pytest.mark.skipif(not __import__("pcgtts.engine.model.llama", fromlist=["x"]).fbgemm_available(),
                    reason="fbgemm's int8 GEMM needs x86 with AVX2")
def test_int8_products_at_batch_round_weights_per_channel_and_inputs_per_call_and_never_under_a_plan():
    """An int8 copy of W serves products of INT8_MIN_ROWS rows or more outside a plan: each equals the
    product of W rounded per output channel to 255 levels and the call's input rounded to 128 levels over
    its min..max (7-bit, fbgemm's AVX2 kernel), summed exactly, plus the bias; fewer rows, and every row
    count under an active batch-invariance plan, are the checkpoint weights' product bit for bit. The
    rounding is real (not the float32 product) and small for inputs of one range."""
    from pcgtts.engine.batch_invariance import PLAIN, InvariancePlan
    from pcgtts.engine.model.llama import INT8_MIN_ROWS, Projection

    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64).half().float(), torch.randn(96)
    proj = Projection(weight, bias)
    assert proj.use_half_weights() and proj.use_int8_weights() and proj.int8 is not None
    w_step = weight.abs().amax(dim=1, keepdim=True) / 127  # [96, 1]
    packed, _ = torch.ops.quantized.linear_unpack(proj.int8)
    w_int8 = packed.dequantize()  # [96, 64]: W on its channel's grid, the nearest level (a tie either way)
    assert torch.allclose(w_int8 / w_step, torch.round(w_int8 / w_step), atol=1e-3)
    assert ((w_int8 - weight).abs() <= w_step / 2 * (1 + 1e-4)).all()
    for rows in [1, INT8_MIN_ROWS - 1, INT8_MIN_ROWS, 16, 64, 300]:
        x = torch.randn(rows, 64)
        if rows < INT8_MIN_ROWS:
            assert torch.equal(proj(x), proj.weights_product(x))
            continue
        # the input's grid: 128 levels from min to max, zero exactly on it (an integer zero point)
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        x_step = torch.tensor((hi - lo) / 127, dtype=torch.float32)
        zero = round(-lo / float(x_step))
        # fbgemm multiplies by the step's float32 inverse (a tie may round either way against a division)
        x_int8 = (torch.clamp(torch.round(x * (1 / x_step)) + zero, 0, 127) - zero) * x_step
        expected = torch.nn.functional.linear(x_int8.double(), w_int8.double()).float() + bias
        torch.testing.assert_close(proj(x), expected, rtol=1e-4, atol=1e-4)
        exact = torch.nn.functional.linear(x, weight, bias)
        error = float((proj(x) - exact).norm() / (exact - bias).norm())
        assert 1e-3 < error < 0.03, error  # the rounding is there, and it is small
        proj.apply_plan(InvariancePlan(row_quantum=4, key_tile=512))
        assert torch.equal(proj(x), proj.weights_product(x))
        proj.apply_plan(PLAIN)
    assert not Projection(weight, copy=False).use_int8_weights()  # a tied head: W as given
    assert not Projection(weight.half()).use_int8_weights()


@pytest.mark.skipif(not __import__("pcgtts.engine.model.llama", fromlist=["x"]).fbgemm_available(),
                    reason="fbgemm's int8 GEMM needs x86 with AVX2")
def test_int8_engine_rounds_only_unseeded_steps_and_keeps_seeded_tokens(tmp_path):
    """cpu_weights="int8": the target's qkv, o and gate_up (not down, not the LM heads) and the Llama draft's
    take int8 copies. Seeded requests run under the batch-invariance plan, so they decode the very tokens
    the fp16 engine gives them, together or one at a time; unseeded steps of the same batch multiply
    through the int8 copies, and their tokens are the speech a sampler draws (within the vocabulary,
    the lengths asked)."""
    from pcgtts.engine import SamplingParams

    engine, prompts, seeded = _weights_engines(tmp_path)

    int8, fp16 = engine("int8"), engine("fp16")
    parts = [int8.target.model, int8.draft.model]
    chosen = [p for part in parts for w in part.layers for p in (w.qkv, w.o, w.gate_up)]
    assert int8.int8_weight_products == len(chosen) == 2 * 3 + 3 and all(p.int8 is not None for p in chosen)
    spared = [p for part in parts for p in part.projections() if not any(p is c for c in chosen)]
    assert spared and all(p.int8 is None for p in spared) and fp16.int8_weight_products == 0
    assert int8.invariance.active
    reference = [g.token_ids for g in fp16.generate(prompts, seeded)]
    assert [g.token_ids for g in int8.generate(prompts, seeded)] == reference
    alone = [int8.generate([p], [s])[0].token_ids for p, s in zip(prompts[:2], seeded[:2], strict=True)]
    assert alone == reference[:2]
    unseeded = int8.generate(prompts, [SamplingParams(temperature=1.0, max_tokens=30) for _ in prompts])
    assert all(len(g.token_ids) == 30 and all(0 <= t < 256 for t in g.token_ids) for g in unseeded)
    qkv = int8.target.model.layers[0].qkv
    x = torch.randn(6 * 4, qkv.in_features)  # an unseeded verify step's rows, outside a plan
    assert not torch.equal(qkv(x), qkv.weights_product(x))


def test_engine_over_an_fp16_checkpoint_decodes_alike_with_either_weights(tmp_path):
    """An fp16 target: with cpu_weights="fp16" every projection of it multiplies from its fp16
    copy where fbgemm runs, the float32 draft's noisy layers keep MKL's (the batch-invariance plan then
    pads rows for both kernels), and the engine generates the greedy tokens the fp32 products give; a
    float32 checkpoint makes no copies; an unknown setting fails at start."""
    from engine_support import engine_config, save_draft_from
    from pcgtts.engine import Engine, SamplingParams
    from pcgtts.engine.model.llama import fbgemm_available

    target = save_tiny_llama(tmp_path / "target", vocab=256, layers=2, seed=3, dtype=torch.float16)
    draft = save_draft_from(target, tmp_path / "draft", layers=1, noise=0.05)
    prompts, params = [[3, 4, 5], list(range(20, 90)), [9] * 7], SamplingParams(temperature=0, max_tokens=40)

    def run(**kw):
        engine = Engine(engine_config(target, draft=draft, num_speculative_tokens=3, **kw))
        return engine, [g.token_ids for g in engine.generate(prompts, params)]

    half, tokens = run(cpu_weights="fp16")
    fp32, reference = run(cpu_weights="fp32")
    assert fp32.half_weight_products == 0
    if fbgemm_available():
        assert all(p.half is not None for p in half.target.model.projections())
        assert any(p.half is None for p in half.draft.model.projections())  # its noisy layers
        assert half.invariance.active
    assert tokens == reference
    float32 = save_tiny_llama(tmp_path / "float32", vocab=256, layers=2, seed=3)
    assert Engine(engine_config(float32)).half_weight_products == 0
    with pytest.raises(ValueError, match="cpu_weights"):
        Engine(engine_config(target, cpu_weights="int4"))


def test_layer_norm_form_of_rms_norm_agrees_with_the_reference_formula():
    """RMSNorm's layer-norm form (decode-sized CPU fp32 inputs) gives Hugging Face's formula to float32
    rounding; prefill-sized inputs and the plain form go through rms_norm, bit for bit."""
    from pcgtts.engine.model.llama import RMSNorm

    torch.manual_seed(0)
    weight = torch.randn(256)
    fast, plain = RMSNorm(weight, 1e-6, layer_norm_form=True), RMSNorm(weight, 1e-6)
    for shape in [(1, 1, 256), (1, 4, 256), (12, 4, 256), (3, 300, 256)]:
        x = torch.randn(*shape) * 3
        reference = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        torch.testing.assert_close(fast(x), reference, rtol=1e-5, atol=1e-5)
        assert torch.equal(plain(x), reference)
        if x.numel() > RMSNorm.LAYER_NORM_MAX_ROWS * 256:
            assert torch.equal(fast(x), reference)
