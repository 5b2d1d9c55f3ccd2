"""The asyncio streaming front: deltas as tokens are accepted, aborts on disconnect, bounded queue."""

from __future__ import annotations

import asyncio

import pytest
from engine_support import engine_config, save_tiny_pair
from pcgtts.engine import Engine, SamplingParams
from pcgtts.engine.async_engine import AsyncEngine
from pcgtts.engine.errors import EngineOverloaded, EngineShutdown

GREEDY = SamplingParams(temperature=0, max_tokens=40)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("async"), seed=41, draft_layers=2)


@pytest.fixture
def engine(pair):
    eng = AsyncEngine(engine_config(pair[0], draft=pair[1], num_speculative_tokens=3, max_num_seqs=4,
                                   max_waiting=8))
    yield eng
    eng.shutdown()


async def collect(engine: AsyncEngine, prompt, params, **kw):
    deltas = [d async for d in engine.stream(prompt, params, **kw)]
    return deltas


async def until(condition, what: str = "the condition", timeout: float = 30.0) -> None:
    """Polls `condition()` (the engine's metrics are published after each step) until it holds."""
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what} did not hold within {timeout} s")


async def wait_idle(engine: AsyncEngine, timeout: float = 30.0):
    def idle() -> bool:
        m = engine.metrics()
        return m.num_running == 0 and m.num_waiting == 0 and m.kv_blocks_used == 0

    await until(idle, f"an idle engine ({engine.metrics()})", timeout)
    return engine.metrics()


async def test_streams_equal_blocking_generate(pair, engine):
    prompts = [[3, 4, 5], [9], list(range(30, 50)), [7, 7]]
    expected = Engine(engine_config(pair[0])).generate(prompts, GREEDY)
    results = await asyncio.gather(*(collect(engine, p, GREEDY) for p in prompts))
    for deltas, exp in zip(results, expected, strict=True):
        assert [t for d in deltas for t in d.token_ids] == exp.token_ids
        assert deltas[-1].finished and deltas[-1].finish_reason == "length"
        assert not any(d.finished for d in deltas[:-1])
        assert sum(d.num_drafted for d in deltas) == 3 * len(deltas)
        assert len(deltas) < len(exp.token_ids)  # several tokens per delta: speculation accepted some
    m = await wait_idle(engine)
    assert m.finished == {"length": 4} and m.generation_tokens == 4 * GREEDY.max_tokens
    assert m.prompt_tokens == sum(map(len, prompts))
    assert m.spec_accepted_tokens == sum(d.num_accepted for r in results for d in r)


async def test_closing_the_stream_aborts_and_frees_blocks(engine):
    stream = engine.stream([1, 2, 3], SamplingParams(temperature=1.0, max_tokens=10_000))
    first = await anext(stream)
    assert first.token_ids and not first.finished
    await stream.aclose()  # the client went away
    m = await wait_idle(engine)
    assert m.finished == {"abort": 1}

    streaming = asyncio.Event()

    async def consume():
        async for _ in engine.stream([4, 5], SamplingParams(max_tokens=10_000)):
            streaming.set()

    task = asyncio.create_task(consume())
    await streaming.wait()  # the request is running: cancelling the task must abort it
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    m = await wait_idle(engine)
    assert m.finished == {"abort": 2}


async def test_abort_by_id_ends_the_stream(engine):
    stream = engine.stream([1, 2], SamplingParams(max_tokens=10_000), request_id="r1")
    await anext(stream)
    engine.abort("r1")
    rest = [d async for d in stream]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    await wait_idle(engine)


async def test_full_waiting_queue_refuses_before_yielding(pair):
    eng = AsyncEngine(engine_config(pair[0], max_num_seqs=1, max_waiting=1))
    try:
        long = SamplingParams(max_tokens=100_000)
        running = eng.stream([1], long)
        await anext(running)  # occupies the only running slot
        waiting = eng.stream([2], long)
        waiting_task = asyncio.create_task(anext(waiting))
        await until(lambda: eng.metrics().num_waiting == 1)
        with pytest.raises(EngineOverloaded):
            await anext(eng.stream([3], long))
        assert eng.metrics().num_waiting == 1
        await running.aclose()
        assert (await waiting_task).token_ids  # admitted once the first left
        await waiting.aclose()
        with pytest.raises(ValueError):
            await anext(eng.stream([], long))
    finally:
        eng.shutdown()
    with pytest.raises(EngineShutdown):
        await anext(eng.stream([1], long))


async def test_shutdown_ends_open_streams(pair):
    eng = AsyncEngine(engine_config(pair[0]))
    stream = eng.stream([1, 2], SamplingParams(max_tokens=100_000))
    await anext(stream)
    await asyncio.get_running_loop().run_in_executor(None, eng.shutdown)
    with pytest.raises(EngineShutdown):
        async for _ in stream:
            pass
