"""The KV mirror (each row's K/V kept contiguous) holds exactly what gathering the pool reads."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from engine_support import DEVICE, engine_config, save_tiny_pair
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.attention import GatherSDPABackend, build_paged_batch, gather_blocks
from pcgtts.engine.block_manager import BlockAllocator, SeqBlocks
from pcgtts.engine.kv_mirror import KVMirror
from test_engine_blocks import run_with_aborts
from test_engine_prefix_cache import voice_requests

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="the mirror serves eager CPU forwards only")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("mirror"), seed=61)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_mirror_rows_equal_the_pool_through_joins_leaves_reorders_rollbacks_and_releases(mask_dtype):
    """Random batches over a shared pool: after every prepare + write, each row's mirrored positions hold
    exactly the pool's K/V (what gather_blocks would have read), padding never lands in a row, and
    attention over the mirror's rows (holes included) gives every real query the gather path's output bit
    for bit. One batch in eight writes the pool around the mirror and empties it (what a forward without
    `states` does): every row must then be gathered again. With a bool and with an additive mask (the
    runners' CPU default); the additive mask's attention equals the bool mask's to float rounding."""
    rng = random.Random(3)
    bs, h, d, layers = 4, 2, 8, 2
    pool = BlockAllocator(num_blocks=200, block_size=bs)
    keys = [torch.zeros((201 * bs, h, d)) for _ in range(layers)]
    values = [torch.zeros((201 * bs, h, d)) for _ in range(layers)]
    mirror = KVMirror(layers, h, d, bs, torch.device("cpu"), torch.float32, max_bytes=1 << 30)
    seqs = [SeqBlocks() for _ in range(6)]
    backend = GatherSDPABackend()
    checked, holes = 0, 0
    for _ in range(300):
        batch = rng.sample(seqs, rng.randint(1, len(seqs)))
        t = rng.choice([1, 1, 2, 4, 5])
        for st in batch:  # some roll back (rejected drafts), one in a while is released and starts over
            if rng.random() < 0.2:
                st.roll_back(pool, max(0, st.num_computed - rng.randint(1, 3)))
            if rng.random() < 0.03 and st.blocks:
                st.release(pool)
            st.ensure(pool, st.num_computed + t)
        cols = pool.blocks_for(max(st.num_computed + t for st in batch))
        tables = torch.tensor([st.blocks[:cols] + [200] * (cols - len(st.blocks[:cols])) for st in batch])
        pad = [rng.randint(0, t - 1) if t > 1 else 0 for _ in batch]  # left padding, as forward_chunks
        positions = torch.tensor([[st.num_computed - p + j for j in range(t)]
                                  for st, p in zip(batch, pad, strict=True)])
        # (padding sits at positions below the row's first real token: the mirror must not write them)
        valid = torch.tensor([[j >= p for j in range(t)] for p in pad])
        meta = build_paged_batch(positions, valid, tables, bs, 200, mask_dtype)
        around = rng.random() < 0.125
        if around:
            mirror.clear()
        mb = None if around else mirror.prepare(batch, positions.tolist(), valid.tolist(), tables, meta.mask,
                                                keys, values)
        holes += 0 if mb is None else mb.span - len(batch)
        for i in range(layers):
            q = torch.randn(len(batch), t, 2 * h, d)
            k, v = torch.randn(len(batch), t, h, d), torch.randn(len(batch), t, h, d)
            gathered = backend.attend(q, k, v, keys[i], values[i], meta, i)  # writes the pool: [B, T, 2h d]
            if mask_dtype != torch.bool:
                bool_mask = replace(meta, mask=build_paged_batch(positions, valid, tables, bs, 200).mask)
                by_bool = backend.attend(q, k, v, keys[i], values[i], bool_mask, i)
                torch.testing.assert_close(gathered[valid], by_bool[valid], rtol=1e-5, atol=1e-6)
            if around:
                continue
            out = backend.attend(q, k, v, keys[i], values[i], replace(meta, mirror=mb), i)
            assert torch.equal(out[valid], gathered[valid])
            mk, mv = (mb.collect(x) for x in mb.layer(i, meta.context_len))  # batch rows [B, ctx, H, D]
            pk, pv = gather_blocks(keys[i], meta), gather_blocks(values[i], meta)
            for r, (st, p) in enumerate(zip(batch, pad, strict=True)):
                end = st.num_computed + t - p
                assert torch.equal(mk[r, :end], pk[r, :end]) and torch.equal(mv[r, :end], pv[r, :end])
                checked += 1
        for st, p in zip(batch, pad, strict=True):
            st.num_computed += t - p
    assert checked > 1000 and holes > 100


def decode_all(engine: Engine, requests) -> list[list[int]]:
    return [g.token_ids for g in engine.generate(*zip(*requests, strict=True))]


def test_engine_tokens_with_mirror_equal_gathering_under_prefix_sharing_preemption_and_aborts(pair):
    # seeded requests over two shared voice prefixes: prefix-cache hits join rows from shared blocks
    requests = voice_requests(10, seed=9)
    gathered = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, block_size=4,
                                    kv_budget_tokens=1024, max_num_seqs=8, kv_mirror_bytes=0))
    assert gathered.target.mirror is None
    mirrored = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, block_size=4,
                                    kv_budget_tokens=1024, max_num_seqs=8))
    assert mirrored.target.mirror is not None and mirrored.draft.mirror is not None
    assert decode_all(mirrored, requests) == decode_all(gathered, requests)

    # a pool that forces preemption, chunked prefill and aborts mid-run, and a mirror bound so small that
    # some forwards fall back to gathering (the mirror empties and refills)
    rng = random.Random(2)
    requests = [([rng.randrange(256) for _ in range(rng.randint(1, 16))],
                 SamplingParams(temperature=1.0, max_tokens=rng.randint(1, 22), seed=40 + i))
                for i in range(16)]
    abort_at = {i: rng.randint(1, 10) for i in rng.sample(range(16), 4)}
    outputs = {}
    for mirror_bytes in (0, 1 << 30, 300_000):  # 300 kB: 2 target rows of 256 positions, 4 draft rows
        engine = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, block_size=4,
                                      kv_budget_tokens=48, max_num_seqs=8, max_num_batched_tokens=6,
                                      kv_mirror_bytes=mirror_bytes))
        outputs[mirror_bytes] = run_with_aborts(engine, requests, abort_at)
        assert engine.metrics().preemptions > 0
    assert outputs[1 << 30] == outputs[0]
    assert outputs[300_000] == outputs[0]
