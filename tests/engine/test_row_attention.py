"""engine/ops/row_attention.py: the rows' own attention. Its compiled form agrees with the torch form (SDPA
over each row's keys with a causal mask), a query's output is the same bits whatever shares the call (batch
mates, their lengths, its place, the number of queries of its row, a prefill chunk or one decode query),
padding queries give zeros, and the polynomial exp is within a few float32 epsilons of float64's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pcgtts.engine.ops.row_attention import ROW_ATTENTION, _exp_shifted


def case(seed: int, batch: int, tokens: int, heads: int, kv_heads: int, storage: int = 600, dim: int = 64):
    """q [B, T, H, D], keys/values [R, S, H_kv, D] with R > B rows in shuffled order, positions Long[B, T]
    (consecutive per row; rows 1, 4, ... left-padded with -1), rows Long[B]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, tokens, heads, dim, generator=g)
    keys = torch.randn(batch + 3, storage, kv_heads, dim, generator=g) * 2
    values = torch.randn(batch + 3, storage, kv_heads, dim, generator=g)
    rows = torch.randperm(batch + 3, generator=g)[:batch]
    last = torch.randint(tokens, storage - 1, (batch,), generator=g)
    positions = last[:, None] - tokens + 1 + torch.arange(tokens)[None, :]
    pad = max(tokens - 1, 1) * (torch.arange(batch) % 3 == 1)  # a one-token row of padding alone
    positions = torch.where(torch.arange(tokens)[None, :] < pad[:, None], -1, positions)
    return q, keys, values, rows, positions


@pytest.mark.parametrize(("batch", "tokens", "heads", "kv_heads"),
                         [(1, 1, 4, 4), (16, 1, 4, 4), (6, 4, 4, 4), (5, 4, 8, 2), (2, 37, 4, 4)])
def test_the_compiled_form_agrees_with_sdpa_over_each_rows_keys(batch, tokens, heads, kv_heads):
    args = case(batch * 100 + tokens, batch, tokens, heads, kv_heads)
    compiled, reference = ROW_ATTENTION.compiled(*args), ROW_ATTENTION.torch(*args)
    assert compiled.shape == reference.shape == args[0].shape
    torch.testing.assert_close(compiled, reference, rtol=1e-5, atol=2e-6)
    padding = args[4] < 0
    assert padding.any() or batch < 2
    assert (compiled[padding] == 0).all()


@pytest.mark.parametrize(("batch", "tokens", "heads", "kv_heads"),
                         [(16, 1, 4, 4), (6, 4, 4, 4), (5, 4, 8, 2)])
def test_an_fp16_kv_store_attends_as_its_float32_widening(batch, tokens, heads, kv_heads):
    """fp16 keys and values (EngineConfig.cpu_kv): the compiled form widens each element as it reads it, so
    its output is the same bits as over the float32 copies of those fp16 values; the torch form agrees."""
    q, keys, values, rows, positions = case(batch * 10 + tokens, batch, tokens, heads, kv_heads)
    half_keys, half_values = keys.half(), values.half()
    assert not torch.equal(half_keys.float(), keys)  # the store rounds
    stored = ROW_ATTENTION.compiled(q, half_keys, half_values, rows, positions)
    widened = ROW_ATTENTION.compiled(q, half_keys.float(), half_values.float(), rows, positions)
    assert torch.equal(stored, widened)
    torch.testing.assert_close(ROW_ATTENTION.torch(q, half_keys, half_values, rows, positions), stored,
                               rtol=1e-5, atol=2e-6)
    # what rounding K/V costs here: the output moves by about fp16's precision, not more
    exact = ROW_ATTENTION.compiled(q, keys, values, rows, positions)
    torch.testing.assert_close(stored, exact, rtol=0, atol=5e-3)


def test_a_querys_output_is_the_same_bits_whatever_shares_the_call():
    """Each query of a 5-row, 4-token call against the same query alone, inside a prefill-sized chunk of its
    own row (positions 0..p), and beside mates of other lengths in another order."""
    q, keys, values, rows, positions = case(7, 5, 4, 4, 4)
    together = ROW_ATTENTION.compiled(q, keys, values, rows, positions)
    shuffled = [3, 0, 4, 1, 2]
    mates = ROW_ATTENTION.compiled(q[shuffled], keys, values, rows[shuffled], positions[shuffled])
    g = torch.Generator().manual_seed(8)
    for b in range(5):
        for t in range(4):
            p = int(positions[b, t])
            if p < 0:
                continue
            alone = ROW_ATTENTION.compiled(q[b:b + 1, t:t + 1], keys, values, rows[b:b + 1],
                                           positions[b:b + 1, t:t + 1])
            assert torch.equal(alone[0, 0], together[b, t]), (b, t)
            assert torch.equal(mates[shuffled.index(b), t], together[b, t])
            # the same query as the last one of a prefill chunk over its row's positions 0..p
            chunk = torch.randn(1, p + 1, 4, 64, generator=g)
            chunk[0, p] = q[b, t]
            prefill = ROW_ATTENTION.compiled(chunk, keys, values, rows[b:b + 1], torch.arange(p + 1)[None])
            assert torch.equal(prefill[0, p], together[b, t]), (b, t)


def test_the_exp_polynomial_is_within_a_few_epsilons():
    x = np.linspace(-87.0, 0.0, 200_001).astype(np.float32)
    s = x.copy()
    total = _exp_shifted(s, np.float32(0.0), x.size, np.zeros(x.size, np.int32))
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(s - exact) / exact) <= 4 * np.finfo(np.float32).eps  # relative: denormals too
    assert abs(total - exact.sum()) <= 1e-5 * exact.sum()


def test_the_engine_decodes_alike_with_either_attention_and_refuses_others(tmp_path):
    """An engine over a tiny model with the rows' own attention (prefill chunks, decode and verify steps,
    the KV mirror on and off, K/V stored in fp16 and in float32) generates the greedy tokens torch's kernel
    over float32 K/V does; an unknown name fails at start."""
    from engine_support import engine_config, save_tiny_pair
    from pcgtts.engine import Engine, SamplingParams

    target, draft = save_tiny_pair(tmp_path, seed=3)
    prompts = [[3, 4, 5], list(range(20, 90)), [9] * 7]
    params = SamplingParams(temperature=0, max_tokens=40)

    def tokens(**kw):
        engine = Engine(engine_config(target, draft=draft, num_speculative_tokens=3,
                                      max_num_batched_tokens=32, **kw))
        rows = kw.get("cpu_attention", "rows") == "rows"
        assert engine.target.row_attention == rows
        # K/V stored in fp16 under the rows' attention unless cpu_kv="fp32" (pool and mirror alike)
        kv_dtype = torch.float16 if rows and kw.get("cpu_kv", "fp16") == "fp16" else torch.float32
        for runner in (engine.target, engine.draft):
            assert {t.dtype for t in runner.cache.tensors()} == {kv_dtype}
            assert runner.mirror is None or runner.mirror.dtype == kv_dtype
        out = [g.token_ids for g in engine.generate(prompts, params)]
        mirror = engine.target.mirror
        assert mirror is None or {t.dtype for t in mirror.keys + mirror.values} == {kv_dtype}
        return out

    reference = tokens(cpu_attention="sdpa")
    assert tokens() == reference
    assert tokens(cpu_kv="fp32") == reference
    assert tokens(kv_mirror_bytes=0) == reference
    assert tokens(deterministic="always") == reference
    with pytest.raises(ValueError, match="cpu_attention"):
        Engine(engine_config(target, cpu_attention="flash"))
    with pytest.raises(ValueError, match="cpu_kv"):
        Engine(engine_config(target, cpu_kv="fp8"))


@pytest.mark.parametrize("form", ["compiled", "torch"])
def test_a_tree_branch_attends_as_its_tokens_would_as_a_chain(form):
    """A row holding [last token, branch 0, branch 1, branch 2] (γ = 3 each) at cache indices n-1.., each
    branch's queries hiding the earlier branches' keys, against the same keys of branch b laid out as a chain
    after the last token: the same bits in the compiled form, the same numbers in the torch form; branch 0
    (no gap) is the chain itself."""
    attend = getattr(ROW_ATTENTION, form)
    g = torch.Generator().manual_seed(11)
    n, k, gamma, heads, dim = 50, 3, 3, 4, 64
    keys = torch.randn(1, n + k * gamma, heads, dim, generator=g)
    values = torch.randn(1, n + k * gamma, heads, dim, generator=g)
    q = torch.randn(1, 1 + k * gamma, heads, dim, generator=g)
    cols = torch.arange(1 + k * gamma)
    branch = (cols - 1).clamp(min=0) // gamma
    gaps = torch.stack([torch.full_like(cols, n), n + branch * gamma], dim=-1)[None]
    tree = attend(q, keys, values, torch.tensor([0]), (n - 1 + cols)[None], gaps)
    for b in range(k):
        chain_keys = torch.cat([keys[:, :n], keys[:, n + b * gamma:n + (b + 1) * gamma]], dim=1)
        chain_values = torch.cat([values[:, :n], values[:, n + b * gamma:n + (b + 1) * gamma]], dim=1)
        columns = [0] + list(range(1 + b * gamma, 1 + (b + 1) * gamma))
        chain = attend(q[:, columns], chain_keys, chain_values, torch.tensor([0]),
                       torch.arange(n - 1, n + gamma)[None])
        if form == "compiled":
            assert torch.equal(tree[:, columns], chain), b
        else:
            torch.testing.assert_close(tree[:, columns], chain, rtol=1e-5, atol=2e-6)
    gapped_mask = gaps[0, :, 1] > gaps[0, :, 0]
    assert gapped_mask.sum() == (k - 1) * gamma  # the test exercises gaps


def test_a_prefetch_hint_changes_nothing_and_never_faults():
    """`prefetch` (engine/ops/kernel.py) only moves cache lines: a loop that asks for every row of an array,
    past its last one too, reads the same sum as numpy, for the float32 and fp16-bits K/V the kernel takes."""
    from numba import njit
    from pcgtts.engine.ops.kernel import CACHE_LINE, prefetch

    @njit
    def total_with_hints(a):
        row_bytes = a.shape[2] * a.shape[3] * a.itemsize
        s = 0.0
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                for line in range(0, row_bytes, CACHE_LINE):
                    prefetch(a, i, j + 8, line)  # rows past the end included
                s += a[i, j].sum()
        return s

    for array in (np.arange(2 * 5 * 3 * 64, dtype=np.float32).reshape(2, 5, 3, 64),
                  np.arange(2 * 5 * 3 * 64, dtype=np.uint16).reshape(2, 5, 3, 64)):
        assert total_with_hints(array) == array.sum(dtype=np.float64)
