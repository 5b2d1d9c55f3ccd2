"""Captured decode graphs (torch.compile on CPU) compute what the eager forward does.

Compiling is slow on a small CPU, so this module compiles one tiny target-only engine (two graphs: one row,
and many rows with any context length) and checks it against the eager engine and the eager forward.
bench/gpu_check.sh runs it with PCGTTS_TEST_DEVICE=cuda, where the mode under test is CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch
from engine_support import DEVICE, engine_config, save_feature_head, save_tiny_llama
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.block_manager import SeqBlocks

MODE = "cuda_graphs" if DEVICE.startswith("cuda") else "compile"
GREEDY = SamplingParams(temperature=0, max_tokens=40)
# fp32 logits of a captured graph may differ from eager by re-associated sums (fused kernels): the
# tolerance is a few float32 ulps of logits of size ~1, far below any gap between top tokens here
ATOL = 1e-4


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    target = save_tiny_llama(root / "target", vocab=256, layers=2, seed=5)
    # the eager engine keeps float32 K/V, as captured graphs do (an eager CPU engine rounds them to fp16 by
    # default, EngineConfig.cpu_kv)
    eager = Engine(engine_config(target, block_size=8, dtype="float32", cpu_kv="fp32"))
    captured = Engine(engine_config(target, block_size=8, dtype="float32", decode_graphs=MODE,
                                    compile_cache_dir=root / "inductor"))
    return eager, captured


def prompts(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (int(k),), generator=gen).tolist()
            for k in torch.randint(2, 30, (n,), generator=gen)]


def test_captured_engine_decodes_the_same_greedy_tokens(engines):
    eager, captured = engines
    assert captured.target.captured is not None and eager.target.captured is None
    assert captured.kv_dtype == torch.float32  # captured graphs write the model's dtype whatever cpu_kv says
    for batch in (prompts(5, seed=1), prompts(1, seed=2)):  # many rows, then one row
        want = [g.token_ids for g in eager.generate(batch, GREEDY)]
        got = [g.token_ids for g in captured.generate(batch, GREEDY)]
        assert got == want


def test_captured_forward_matches_eager_logits_and_cache(engines):
    _, captured = engines
    runner = captured.target
    states = [SeqBlocks() for _ in range(3)]
    gen = torch.Generator().manual_seed(3)
    chunks = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (5, 17, 30)]  # 1, 3, 4 blocks
    for st, chunk in zip(states, chunks, strict=True):
        st.ensure(runner.blocks, len(chunk) + 1)
    runner.forward_chunks(states, chunks)  # prefill (eager: T is not a decode shape)
    lengths = torch.tensor([st.num_computed for st in states])
    ids = torch.tensor([[7], [8], [9]], device=runner.device)
    positions = lengths[:, None].to(runner.device)
    valid = torch.ones(3, 1, dtype=torch.bool, device=runner.device)
    tables = runner.block_tables(states, int(lengths.max()) + 1)
    before = [t.clone() for t in runner.cache.tensors()]
    got = runner.logits(runner.forward(ids, positions, valid, tables))
    cache_got = [t.clone() for t in runner.cache.tensors()]
    for t, b in zip(runner.cache.tensors(), before, strict=True):
        t.copy_(b)
    want = runner.logits(runner.forward(ids, positions, valid, tables, eager=True))
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    for g, w, b in zip(cache_got, runner.cache.tensors(), before, strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
        assert not torch.equal(g, b)  # the new K/V were written, in place, by the graph
    for st in states:
        st.release(runner.blocks)


def test_captured_speculative_engine_with_a_draft_of_other_head_counts(tmp_path):
    """Target and draft share the forward code but not their shapes (4 query / 2 KV heads against 2 / 2,
    other widths): each gets graphs of its own, built at start-up, and greedy speculative decoding gives
    the eager engine's tokens."""
    target = save_tiny_llama(tmp_path / "target", vocab=256, layers=2, seed=5)
    draft = save_tiny_llama(tmp_path / "draft", vocab=256, hidden=32, layers=1, heads=2, kv_heads=2,
                            intermediate=48, seed=6)
    common = dict(draft=draft, num_speculative_tokens=3, block_size=8, dtype="float32")
    eager = Engine(engine_config(target, **common))
    captured = Engine(engine_config(target, **common, decode_graphs=MODE,
                                    compile_cache_dir=tmp_path / "inductor"))
    assert captured.draft.captured is not None and captured.target.captured is not None
    for batch in (prompts(4, seed=7), prompts(1, seed=8)):
        want = [g.token_ids for g in eager.generate(batch, GREEDY)]
        got = captured.generate(batch, GREEDY)
        assert [g.token_ids for g in got] == want
        assert all(g.num_drafted > 0 for g in got)  # the draft's graphs proposed, the target's verified


def test_captured_target_with_a_feature_head(tmp_path):
    """A feature head keeps the target's hidden states across steps: taken out of a captured forward's
    output (a buffer the next replay overwrites) they must be copies, or later proposals would read the
    wrong state. Greedy tokens equal the eager engine's."""
    target = save_tiny_llama(tmp_path / "target", vocab=256, layers=2, seed=5)
    head = save_feature_head(target, tmp_path / "head", scale=0.3)
    common = dict(draft=head, num_speculative_tokens=3, block_size=8, dtype="float32")
    eager = Engine(engine_config(target, **common))
    captured = Engine(engine_config(target, **common, decode_graphs=MODE,
                                    compile_cache_dir=tmp_path / "inductor"))
    assert captured.head is not None and captured.target.captured is not None
    for batch in (prompts(4, seed=7), prompts(1, seed=8)):
        want = eager.generate(batch, GREEDY)
        got = captured.generate(batch, GREEDY)
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
        assert [g.num_accepted for g in got] == [g.num_accepted for g in want]
