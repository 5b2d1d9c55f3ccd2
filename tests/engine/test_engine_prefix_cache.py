"""Prefix cache in the paged KV: shared read-only blocks, same seeded outputs, LRU eviction, no leaks."""

from __future__ import annotations

import random

import pytest
import torch
from engine_support import engine_config, save_tiny_pair
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.block_manager import BlockAllocator, SeqBlocks
from pcgtts.engine.prefix_cache import prefix_hashes
from test_engine_blocks import check_block_invariants, run_with_aborts

BLOCK = 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("prefix"), seed=41)


def voice_requests(n: int, seed: int, voices: int = 2, voice_len: int = 13
                   ) -> list[tuple[list[int], SamplingParams]]:
    """n requests over `voices` shared prompt prefixes (a voice's reference) plus own text, seeded."""
    rng = random.Random(seed)
    refs = [[rng.randrange(256) for _ in range(voice_len)] for _ in range(voices)]
    out = []
    for i in range(n):
        prompt = refs[i % voices] + [rng.randrange(256) for _ in range(rng.randint(1, 7))]
        out.append((prompt, SamplingParams(temperature=1.0, max_tokens=rng.randint(4, 14), seed=500 + i)))
    return out


def make_engine(pair, caching: bool, **kw) -> Engine:
    kw = {"kv_budget_tokens": 1024, "max_num_seqs": 8} | kw
    return Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, block_size=BLOCK,
                                enable_prefix_caching=caching, **kw))


def test_allocator_shares_counts_references_and_evicts_least_recently_used():
    pool = BlockAllocator(num_blocks=4, block_size=2)
    prompt_a, prompt_b = [1, 2, 3, 4, 5], [7, 8, 9, 10, 11]
    a = SeqBlocks()
    a.ensure(pool, 5)
    a.num_computed = 4
    a.cache_prefix(pool, prompt_a, len(prompt_a))  # blocks [1,2] and [3,4] become shareable
    b = SeqBlocks()
    assert b.share_prefix(pool, prompt_a, 4) == 4 and b.blocks == a.blocks[:2]
    assert [pool.cache.ref_count[x] for x in a.blocks] == [2, 2, 1]
    a_blocks = list(a.blocks)
    a.release(pool)
    b.release(pool)
    assert pool.num_used == 0 and pool.num_free == 4 and len(pool.cache.evictable) == 2
    c = SeqBlocks()  # a different prefix misses, and taking 3 blocks evicts the LRU cached one: a
    assert c.share_prefix(pool, prompt_b, 4) == 0  # table's tail is given back first, so its tail goes
    c.ensure(pool, 6)
    assert len(pool.cache.block_of) == 1
    d = SeqBlocks()  # the head of the prefix is still there
    assert d.share_prefix(pool, prompt_a, 4) == 2 and d.blocks == a_blocks[:1]
    c.release(pool)
    d.release(pool)
    assert pool.num_used == 0 and sum(pool.cache.ref_count) == 0


def test_cached_prefix_gives_the_seeded_tokens_of_an_uncached_run_and_never_writes_shared_blocks(pair):
    requests = voice_requests(12, seed=3)
    plain = make_engine(pair, caching=False)
    reference = [g.token_ids for g in plain.generate(*zip(*requests, strict=True))]
    assert plain.metrics().prefix_cache_hits == 0

    cached = make_engine(pair, caching=True)
    first = cached.generate([requests[0][0], requests[1][0]], [requests[0][1], requests[1][1]])
    assert [g.token_ids for g in first] == reference[:2]
    snapshots = {}  # K/V of every cached block, in both models, before others share them
    for name, runner in (("target", cached.target), ("draft", cached.draft)):
        blocks = list(runner.blocks.cache.key_of)
        assert blocks, f"nothing cached in the {name}"
        views = [t.view(-1, BLOCK, *t.shape[1:]) for t in runner.cache.tensors()]  # per layer K, V by block
        snapshots[name] = (runner, views, blocks, [v[blocks].clone() for v in views])
    rest = cached.generate(*zip(*requests[2:], strict=True))
    assert [g.token_ids for g in rest] == reference[2:]
    m = cached.metrics()
    assert m.prefix_cache_hits >= 10 * 12  # 3 full blocks of each voice, for the 10 later requests
    assert m.prefix_cache_queries == sum(len(p) for p, _ in requests)
    for runner, views, blocks, before in snapshots.values():
        assert all(torch.equal(v[blocks], b) for v, b in zip(views, before, strict=True))  # only read
        assert all(runner.blocks.cache.is_cached(b) for b in blocks)


def test_eviction_under_a_tiny_kv_budget_keeps_outputs_and_leaks_nothing_after_aborts(pair):
    requests = voice_requests(24, seed=9, voices=5)
    reference = [g.token_ids for g in make_engine(pair, caching=False).generate(*zip(*requests, strict=True))]
    # 16 blocks of 4 tokens per model: five voices' prefixes cannot all stay cached alongside running work.
    tight = make_engine(pair, caching=True, kv_budget_tokens=64, max_num_seqs=4, max_num_batched_tokens=12)
    evictions = []
    evict = tight.target.blocks.cache.evict_lru
    tight.target.blocks.cache.evict_lru = lambda: evictions.append(evict()) or evictions[-1]
    abort_at = {3: 2, 8: 5, 15: 1, 20: 7}
    outputs = run_with_aborts(tight, requests, abort_at)
    assert [b for b in evictions if b is not None], "the tiny budget never evicted a cached block"
    m = tight.metrics()
    assert m.prefix_cache_hits > 0
    for i, out in outputs.items():
        if i in abort_at:
            assert out == reference[i][:len(out)]
        else:
            assert out == reference[i], i
    for runner in (tight.target, tight.draft):  # every reference returned; cached blocks held by nobody
        assert runner.blocks.num_used == 0 and sum(runner.blocks.cache.ref_count) == 0
    check_block_invariants(tight)


def test_pinned_prefix_survives_pressure(pair):
    requests = voice_requests(16, seed=11, voices=4)
    engine = make_engine(pair, caching=True, kv_budget_tokens=64, max_num_seqs=4)
    voice = requests[0][0][:12]
    engine.pin_prefix(voice)
    engine.generate(*zip(*requests, strict=True))
    pool = engine.target.blocks
    assert len(pool.cache.pinned_blocks) == 3 and pool.num_used == 3  # held by the pin alone
    hits = engine.metrics().prefix_cache_hits
    engine.generate([requests[0][0]], requests[0][1])
    assert engine.metrics().prefix_cache_hits - hits == 12
    check_block_invariants(engine)


def test_lru_pins_make_room_for_newer_ones_and_never_for_presets():
    """Uploaded voices are pinned `lru`: when the pin budget is full the least recently pinned of them
    gives its blocks back (still cached, evictable), a preset's pin never does, and pinning a voice again
    makes it the most recent."""
    pool = BlockAllocator(num_blocks=16, block_size=2, max_pinned_fraction=0.25)  # 4 blocks of pins
    preset, up_a, up_b = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]

    def compute(prompt):  # a request computes the prompt (+1 token) and ends
        seq = SeqBlocks()
        seq.share_prefix(pool, prompt, len(prompt))
        seq.ensure(pool, len(prompt) + 1)
        seq.num_computed = len(prompt)
        seq.cache_prefix(pool, prompt + [0], len(prompt))
        seq.release(pool)

    def pinned(prompt):
        return {pool.cache.block_of.get(k) for k in prefix_hashes(prompt, 2, 2)} <= pool.cache.pinned_blocks

    pool.pin(preset)
    compute(preset)
    pool.pin(up_a, lru=True)
    compute(up_a)
    assert pinned(preset) and pinned(up_a) and len(pool.cache.pinned_blocks) == 4  # the budget is full
    pool.pin(up_b, lru=True)  # a request for another uploaded voice: a, the least recent, makes room
    compute(up_b)
    assert pinned(preset) and pinned(up_b) and not pinned(up_a)  # (the preset never does)
    assert all(pool.cache.block_of.get(k) in pool.cache.evictable for k in prefix_hashes(up_a, 2, 2))
    assert len(pool.cache.pinned_blocks) == 4 and pool.num_used == 4  # held by the pins alone
    pool.pin(up_a, lru=True)  # a again: its blocks are still cached, so they are pinned in place at once
    assert pinned(preset) and pinned(up_a) and not pinned(up_b)
    compute(up_a)
    assert pinned(up_a) and sorted(pool.cache.ref_count) == [0] * 12 + [1] * 4  # nothing leaked
