"""One request's fault stays that request's: the batch step goes on for the others, bit for bit; only a fault
that is nobody's (out of memory, device lost) fails everyone, and then the engine says so."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch
from engine_support import engine_config, save_tiny_pair
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.async_engine import AsyncEngine
from pcgtts.engine.errors import EngineFault, RequestFailed
from pcgtts.engine.speech.base import DecodeConstraint

PROMPTS = [[3, 4, 5], [9, 10], list(range(30, 45)), [7, 7, 8], [11, 12, 13, 14]]


class FailsAfter(DecodeConstraint):
    """A constraint that raises once its request has generated `after` tokens: a per-request fault deep in
    the batched step (after the draft has run for everyone)."""

    def __init__(self, after: int, error: type[BaseException] = ValueError):
        self.after = after
        self.error = error

    def apply(self, logits, histories):
        if any(len(h) >= self.after for h in histories):
            raise self.error("poisoned request")
        return logits


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("faults"), seed=5, noise=0.1)


def seeded(i: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, seed=500 + i)


def test_a_poisoned_sequence_fails_alone_and_the_others_equal_a_clean_run(pair):
    engine = Engine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, max_num_seqs=8))
    clean = engine.generate(PROMPTS, [seeded(i) for i in range(len(PROMPTS))])
    poison = replace(seeded(99), constraint=FailsAfter(5))
    params = [seeded(0), seeded(1), poison, seeded(2), seeded(3), seeded(4)]
    mixed = engine.generate(PROMPTS[:2] + [[1, 2]] + PROMPTS[2:], params)
    assert mixed[2].finish_reason == "error" and 0 < len(mixed[2].token_ids) < 40
    survivors = mixed[:2] + mixed[3:]
    assert [g.token_ids for g in survivors] == [g.token_ids for g in clean]
    assert all(g.finish_reason == "length" and len(g.token_ids) == 40 for g in survivors)
    assert engine.metrics().finished["error"] == 1 and engine.kv_blocks_in_use() == (0, 0)


@pytest.mark.parametrize("field,value", [
    ("top_k", 2**63), ("top_k", -1), ("repetition_penalty", 1e-300), ("repetition_penalty", float("nan")),
    ("temperature", 1e-40), ("temperature", float("inf")), ("top_p", 0.0), ("max_tokens", 0),
    ("seed", 2**64), ("num_speculative_tokens", 0), ("top_k", 2.5), ("max_tokens", True),
])
def test_out_of_range_sampling_is_refused_when_made_and_when_it_enters_the_engine(pair, field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
    params = SamplingParams(max_tokens=5)
    object.__setattr__(params, field, value)  # changed after construction: the engine checks again
    engine = Engine(engine_config(pair[0]))
    with pytest.raises(ValueError, match=field):
        engine.add_request([1, 2, 3], params)
    assert not engine.has_unfinished()


async def test_async_streams_beside_a_poisoned_request_complete(pair):
    engine = AsyncEngine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, max_num_seqs=8))
    try:
        async def tokens(prompt, params):
            return [t async for d in engine.stream(prompt, params) for t in d.token_ids]

        reference = await asyncio.gather(*(tokens(p, seeded(i)) for i, p in enumerate(PROMPTS)))
        tasks = [asyncio.ensure_future(tokens(p, seeded(i))) for i, p in enumerate(PROMPTS)]
        with pytest.raises(RequestFailed, match="poisoned"):
            await tokens([1, 2], replace(seeded(9), constraint=FailsAfter(3)))
        assert await asyncio.gather(*tasks) == reference
        assert engine.fault is None and engine.metrics().finished["error"] == 1
        assert await tokens([5, 6], seeded(0))  # still serving
    finally:
        engine.shutdown()


async def test_a_device_fault_fails_everyone_and_the_engine_reports_it(pair):
    engine = AsyncEngine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, max_num_seqs=8))
    try:
        async def tokens(prompt, params):
            return [t async for d in engine.stream(prompt, params) for t in d.token_ids]

        results = await asyncio.gather(
            tokens([1, 2], replace(seeded(9), constraint=FailsAfter(20, torch.OutOfMemoryError))),
            *(tokens(p, replace(seeded(i), max_tokens=200)) for i, p in enumerate(PROMPTS)),
            return_exceptions=True)
        assert all(isinstance(r, EngineFault) for r in results), results
        assert engine.fault is not None and "OutOfMemoryError" in engine.fault
        with pytest.raises(EngineFault):
            await tokens([5, 6], seeded(0))
    finally:
        engine.shutdown()
