"""Paged KV under load: preemption, chunked prefill and aborts keep outputs right and leak no block."""

from __future__ import annotations

import random

import pytest
import torch
from engine_support import engine_config, save_tiny_pair
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.block_manager import BlockAllocator, OutOfBlocks, SeqBlocks


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("blocks"), seed=31, draft_layers=2)


def test_allocator_and_rollback():
    pool = BlockAllocator(num_blocks=5, block_size=4)
    a, b = SeqBlocks(), SeqBlocks()
    a.ensure(pool, 9)  # 3 blocks
    assert len(a.blocks) == 3 and pool.num_free == 2
    with pytest.raises(OutOfBlocks):
        b.ensure(pool, 12)
    assert b.blocks == [] and pool.num_free == 2  # all or nothing
    a.num_computed = 9
    a.roll_back(pool, 5)  # positions 5..8 rejected: the third block goes back
    assert a.num_computed == 5 and len(a.blocks) == 2 and pool.num_free == 3
    b.ensure(pool, 12)
    assert sorted(a.blocks + b.blocks) == list(range(5))
    a.release(pool)
    b.release(pool)
    assert pool.num_free == 5


def check_block_invariants(engine: Engine) -> None:
    """Every used block is held by running sequences (or a pin), exactly as often as its reference count
    says, in each model's pool; waiting sequences hold none."""
    from collections import Counter

    for runner, state in ((engine.target, lambda s: s.target), (engine.draft, lambda s: s.draft)):
        if runner is None:
            continue
        pool = runner.blocks
        owners = Counter(b for s in engine.scheduler.running for b in state(s).blocks)
        owners.update(pool.cache.pinned_blocks)
        assert len(owners) == pool.num_used
        assert all(pool.cache.ref_count[b] == n for b, n in owners.items())
        assert sum(pool.cache.ref_count) == sum(owners.values())
        assert all(not state(s).blocks for s in engine.scheduler.waiting)


def run_with_aborts(engine: Engine, requests, abort_at: dict[int, int]) -> dict[int, list[int]]:
    """Drive step() by hand; request i is aborted after step abort_at[i]."""
    ids = [engine.add_request(p, params) for p, params in requests]
    index = {rid: i for i, rid in enumerate(ids)}
    outputs: dict[int, list[int]] = {i: [] for i in range(len(ids))}
    step = 0
    while engine.has_unfinished():
        for out in engine.step():
            outputs[index[out.request_id]] += out.token_ids
        check_block_invariants(engine)
        step += 1
        for i, when in abort_at.items():
            if when == step:
                engine.abort(ids[i])
    return outputs


def test_preemption_aborts_and_chunked_prefill_keep_outputs_and_free_every_block(pair):
    rng = random.Random(5)
    requests = []
    for i in range(24):
        prompt = [rng.randrange(256) for _ in range(rng.randint(1, 16))]
        greedy = i % 2 == 0
        params = SamplingParams(temperature=0 if greedy else 1.0, max_tokens=rng.randint(1, 22),
                                seed=None if greedy else 100 + i)
        requests.append((prompt, params))
    abort_at = {i: rng.randint(0, 12) for i in rng.sample(range(24), 6)}

    roomy = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, block_size=4,
                                kv_budget_tokens=4096, max_num_seqs=64))
    reference = {i: g.token_ids for i, g in enumerate(roomy.generate(*zip(*requests, strict=True)))}

    # 12 blocks of 4 tokens per model: a handful of sequences fill it, so the scheduler must preempt;
    # a 6-token prefill budget chunks most prompts.
    tight = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, block_size=4,
                                kv_budget_tokens=48, max_num_seqs=8, max_num_batched_tokens=6))
    outputs = run_with_aborts(tight, requests, abort_at)
    m = tight.metrics()
    assert m.preemptions > 0
    assert tight.kv_blocks_in_use() == (0, 0) and m.kv_usage == 0 and m.num_running == m.num_waiting == 0
    assert sum(m.finished.values()) == len(requests)
    aborted = {i for i, when in abort_at.items() if len(outputs[i]) < len(reference[i]) or when == 0}
    for i, out in outputs.items():
        if i in aborted:
            assert out == reference[i][:len(out)]  # a prefix: nothing wrong before the abort
        else:
            assert out == reference[i], i  # preemption + recompute change nothing, greedy or seeded
    assert m.finished.get("abort", 0) >= 1


def test_waiting_queue_is_bounded(pair):
    from pcgtts.engine.errors import EngineOverloaded, RequestTooLong

    engine = Engine(engine_config(pair[0], max_waiting=2, kv_budget_tokens=64, block_size=4))
    engine.add_request([1, 2], SamplingParams(max_tokens=2))
    engine.add_request([1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(EngineOverloaded):
        engine.add_request([1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(RequestTooLong):
        engine.validate(list(range(64)), SamplingParams())
    with pytest.raises(ValueError):
        engine.validate([256], SamplingParams())
    while engine.has_unfinished():
        engine.step()
    engine.add_request([1, 2], SamplingParams(max_tokens=2))  # room again


def test_kv_budget_in_bytes(pair):
    engine = Engine(engine_config(pair[0], draft=pair[1], kv_budget_bytes=1 << 20, block_size=16))
    assert engine.kv_dtype == torch.float16  # the CPU default (cpu_kv="fp16"): 2 bytes an element
    per_token = 2 * 2 * engine.target_config.num_kv_heads * engine.target_config.head_dim * 2  # 2 layers, K+V
    expected_blocks = (1 << 20) // (2 * per_token * 16)  # target + draft caches share the budget
    assert engine.target.blocks.num_blocks == engine.draft.blocks.num_blocks == expected_blocks
    assert engine.target.cache.num_bytes + engine.draft.cache.num_bytes <= (1 << 20) + 2 * 16 * per_token
    assert all(torch.all(t == 0) for t in engine.target.cache.tensors())
