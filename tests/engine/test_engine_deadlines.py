"""Audio-deadline scheduling with a deliberately slow step (a simulated clock that each step advances by
a cost growing with its batch): a new request's first audio is not held up behind long streams that are
far ahead of their listeners, and no stream starves even while urgent requests keep arriving."""

from __future__ import annotations

import pytest
from engine_support import engine_config, save_tiny_llama
from pcgtts.engine import Engine, SamplingParams

FIRST_BLOCK = 8  # tokens a new request needs before its first audio


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("deadlines") / "target", vocab=256, layers=2, seed=61)


class SlowClock:
    """Simulated time: each decode step of B sequences takes 0.05 + 0.02 * B seconds."""

    def __init__(self, engine: Engine):
        self.now = 0.0
        self.batches: list[list[str]] = []  # request ids of each step's decode batch
        engine.scheduler.clock = lambda: self.now
        step = engine.decoder.step

        def slow_step(seqs, *args):
            self.batches.append([s.request_id for s in seqs])
            self.now += 0.05 + 0.02 * len(seqs)
            return step(seqs, *args)

        engine.decoder.step = slow_step


def long_streams(engine: Engine, clock: SlowClock, n: int) -> list[str]:
    """n streams that never stop on their own; after two steps each has audio buffered far ahead."""
    ids = [engine.add_request([7, 3, i + 1], SamplingParams(temperature=1.0, max_tokens=10_000, seed=i))
           for i in range(n)]
    for _ in range(2):
        engine.step()
    for rid in ids:
        engine.set_deadline(rid, clock.now + 30.0)
    return ids


def time_to_first_block(max_defer: int, target) -> tuple[float, SlowClock, list[str]]:
    engine = Engine(engine_config(target, block_size=4, max_num_seqs=16, max_defer_steps=max_defer))
    clock = SlowClock(engine)
    streams = long_streams(engine, clock, 8)
    new = engine.add_request([9, 9, 2], SamplingParams(temperature=1.0, max_tokens=10_000, seed=99))
    start, got = clock.now, 0
    while got < FIRST_BLOCK:
        got += sum(len(o.token_ids) for o in engine.step() if o.request_id == new)
    return clock.now - start, clock, streams


def test_new_request_first_audio_is_not_held_up_behind_streams_far_ahead(target):
    with_deadlines, clock, streams = time_to_first_block(max_defer=4, target=target)
    fifo, _, _ = time_to_first_block(max_defer=0, target=target)
    assert with_deadlines < 0.6 * fifo  # far-ahead streams sat out most of the new request's steps
    # ...but none of them sat out more than 4 steps in a row
    for rid in streams:
        ran = [i for i, batch in enumerate(clock.batches) if rid in batch]
        assert max(b - a for a, b in zip(ran, ran[1:], strict=False)) <= 5


def test_no_stream_starves_while_urgent_requests_keep_arriving(target):
    engine = Engine(engine_config(target, block_size=4, max_num_seqs=64, max_defer_steps=3))
    clock = SlowClock(engine)
    streams = long_streams(engine, clock, 4)
    for k in range(40):  # a new (urgent) request every step, while the streams stay far ahead
        engine.add_request([5, k % 200 + 1], SamplingParams(temperature=1.0, max_tokens=3, seed=k))
        engine.step()
        for rid in streams:
            engine.set_deadline(rid, clock.now + 30.0)
    assert engine.scheduler.num_deferred > 0
    for rid in streams:
        ran = [i for i, batch in enumerate(clock.batches) if rid in batch]
        assert len(ran) >= 40 // 4 and max(b - a for a, b in zip(ran, ran[1:], strict=False)) <= 4
        # a stream close to running dry is never deferred
    engine.set_deadline(streams[0], clock.now + 0.5)
    engine.add_request([5, 1], SamplingParams(max_tokens=3))
    engine.step()
    assert streams[0] in clock.batches[-1]
