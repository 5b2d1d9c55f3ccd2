"""adopt_torch_threads: a worker thread runs its OpenMP parallel regions with torch's configured count."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest
import torch
from pcgtts.engine.torch_threads import adopt_torch_threads


def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch runs its parallel regions on (libgomp / libiomp), or None.

    Other wheels ship their own copy (sentencepiece brings a second libgomp), so the one meant is the runtime
    whose per-thread count follows torch.set_num_threads in this thread."""
    torch.ones(1)  # make sure torch's libraries are mapped
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line})
    except OSError:
        return None
    before = torch.get_num_threads()
    try:
        for path in paths:
            runtime = ctypes.CDLL(path)
            if all(_follows(runtime, n) for n in (1, 2)):
                return runtime
    finally:
        torch.set_num_threads(before)
    return None


def _follows(runtime: ctypes.CDLL, n: int) -> bool:
    torch.set_num_threads(n)
    return runtime.omp_get_max_threads() == n


@pytest.mark.skipif(_openmp() is None or (os.cpu_count() or 1) < 2,
                    reason="needs torch's OpenMP runtime and at least 2 cores")
def test_a_new_thread_uses_openmps_default_until_it_adopts_torchs_thread_count():
    omp = _openmp()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    seen = {}

    def worker():
        seen["default"] = omp.omp_get_max_threads()  # what a thread gets without adopting
        adopt_torch_threads()
        seen["adopted"] = omp.omp_get_max_threads()

    try:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(before)
    assert seen["adopted"] == 1
    assert seen["default"] == int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))  # why it exists


class CountingCodec:
    """The shipped demo codec for DecodePool, recording the OpenMP thread count each batch runs with."""

    def __init__(self, omp):
        from pcgtts.tts.bundle import DEFAULT_MODEL_DIR, ModelBundle

        self.codec = ModelBundle.from_dir(DEFAULT_MODEL_DIR).load_codec()
        self.omp, self.counts = omp, []

    def decode_streams(self, work):
        self.counts.append(self.omp.omp_get_max_threads())
        return self.codec.decode_streams(work)


@pytest.mark.skipif(_openmp() is None or (os.cpu_count() or 1) < 2,
                    reason="needs torch's OpenMP runtime and at least 2 cores")
def test_the_engine_thread_runs_its_own_count_and_the_codec_threads_keep_theirs(tmp_path):
    """EngineConfig.threads = 2 on the engine thread while the codec threads keep the one thread read before
    the engine started, although the engine thread's setting rewrites torch's process-wide record."""
    import asyncio

    import numpy as np
    from engine_support import engine_config, save_tiny_pair
    from pcgtts.engine import SamplingParams
    from pcgtts.engine.async_engine import AsyncEngine
    from pcgtts.tts.decode_pool import DecodePool

    omp = _openmp()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    target, _ = save_tiny_pair(tmp_path, seed=5)
    codec = CountingCodec(omp)
    try:
        codec_threads = torch.get_num_threads()  # what TTSService.load reads before starting the engine
        engine = AsyncEngine(engine_config(target, threads=2))
        pool = DecodePool(codec, threads=1, torch_threads=codec_threads)
        seen = []
        step = engine.engine.step

        def counted_step():
            seen.append(omp.omp_get_max_threads())
            return step()

        engine.engine.step = counted_step

        async def run():
            deltas = [d async for d in engine.stream([3, 4, 5], SamplingParams(temperature=0, max_tokens=8))]
            codes = np.random.default_rng(0).integers(0, codec.codec.codebook_size, size=60)
            await pool.push(codec.codec.streaming_decoder(), codes)
            return deltas

        deltas = asyncio.run(run())
        pool.close()
        engine.shutdown()
    finally:
        torch.set_num_threads(before)
    assert sum(len(d.token_ids) for d in deltas) == 8
    assert seen and set(seen) == {2}
    assert codec.counts == [1]
