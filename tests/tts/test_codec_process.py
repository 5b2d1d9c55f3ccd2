"""The codec in a process of its own (tts/codec_process.py): the same audio as on the service's threads, one
stream's failure its own, a child that dies costs only the streams it held, handles that go free their
decoders, and a child that cannot load fails start-up with the reason."""

from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest
from pcgtts.tts.codec_process import CodecProcessError, CodecRecipe
from pcgtts.tts.decode_pool import DecodePool


@pytest.fixture(scope="module")
def codec(tts_service):
    return tts_service.codec


@pytest.fixture(scope="module")
def process_pool(demo_bundle, codec):
    pool = DecodePool(codec, threads=1, process=CodecRecipe(model_dir=demo_bundle))
    pool.wait_ready()
    yield pool
    pool.close()


def _sequences(codec, count: int, frames: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, codec.codebook_size, size=frames) for _ in range(count)]


async def _stream_all(pool: DecodePool, seqs: list[np.ndarray], step: int = 3):
    """Every sequence fed `step` codes at a time, the streams' pushes concurrent (so they share codec
    calls), then flushed -> (each stream's audio, each decoder's codes_until_audio after every push)."""
    decoders = [pool.streaming_decoder() for _ in seqs]
    audio: list[list[np.ndarray]] = [[] for _ in seqs]
    until: list[list[int | None]] = [[] for _ in seqs]
    for pos in range(0, max(map(len, seqs)), step):
        live = [i for i, s in enumerate(seqs) if pos < len(s)]
        out = await asyncio.gather(*(pool.push(decoders[i], seqs[i][pos: pos + step]) for i in live))
        for i, (chunk, _) in zip(live, out, strict=True):
            audio[i].append(chunk)
            until[i].append(decoders[i].codes_until_audio())
    for i, (chunk, _) in enumerate(await asyncio.gather(*(pool.push(d, None) for d in decoders))):
        audio[i].append(chunk)
    return [np.concatenate(a) for a in audio], until


def test_process_pool_decodes_the_same_audio_as_threads(codec, process_pool):
    """Six streams of different lengths, batched: every stream's samples bit for bit as the in-process
    pool gives them, and the decoders' codes-until-audio (the first-audio pacing reads it) alike."""
    seqs = [s[: 40 + 23 * i] for i, s in enumerate(_sequences(codec, 6, 200, seed=3))]
    threads = DecodePool(codec, threads=1)
    try:
        expected, expected_until = asyncio.run(_stream_all(threads, seqs))
    finally:
        threads.close()
    before = process_pool.snapshot()
    got, got_until = asyncio.run(_stream_all(process_pool, seqs))
    after = process_pool.snapshot()
    assert process_pool.in_process
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == np.float32 and a.shape == b.shape and np.array_equal(a, b)
    assert got_until == expected_until
    assert any(u not in (0, None) for us in got_until for u in us)  # the pacing has something to read
    assert after.stream_jobs - before.stream_jobs == sum(len(range(0, len(s), 3)) + 1 for s in seqs)
    assert after.stream_jobs - before.stream_jobs > after.calls - before.calls  # calls were shared


def test_a_streams_failure_in_the_process_is_its_own(codec, process_pool):
    """A stream whose codes the codec cannot take gets the codec's own exception back from the child; the
    streams pushed with it get their audio exactly as when decoded alone."""
    good = _sequences(codec, 3, 60, seed=4)
    bad = np.array([5, codec.codebook_size + 7, 9] * 20)

    async def run():
        decoders = [process_pool.streaming_decoder() for _ in range(4)]
        codes = [good[0], bad, good[1], good[2]]
        out = await asyncio.gather(*(process_pool.push(d, c) for d, c in zip(decoders, codes, strict=True)),
                                   return_exceptions=True)
        tails = [await process_pool.push(d, None) for i, d in enumerate(decoders) if i != 1]
        return out, tails

    out, tails = asyncio.run(run())
    assert isinstance(out[1], IndexError)
    for (audio, _), (tail, _), codes in zip([out[0], out[2], out[3]], tails, good, strict=True):
        assert np.array_equal(np.concatenate([audio, tail]), codec.decode(codes))


def test_decoders_whose_handles_are_gone_are_dropped(codec, process_pool):
    """A stream that ends (its handle dropped, as when a client goes away) frees its decoder in the child
    with the next batch."""
    seqs = _sequences(codec, 5, 30, seed=5)

    async def run(keep: list):
        decoders = [process_pool.streaming_decoder() for _ in seqs]
        keep.extend(decoders[:1])
        await asyncio.gather(*(process_pool.push(d, s) for d, s in zip(decoders, seqs, strict=True)))
        return process_pool._workers[0].child_streams

    kept: list = []
    held = asyncio.run(run(kept))
    assert held >= len(seqs)
    gc.collect()  # nothing refers to the four other handles (a cycle would only delay their drop)
    asyncio.run(_stream_all(process_pool, seqs[:1]))  # the next batch carries the drops
    assert process_pool._workers[0].child_streams == 2  # the kept handle and the finished one above
    kept.clear()


def test_a_codec_process_that_dies_costs_only_its_streams(codec, demo_bundle):
    """Killed mid-service: the next batch fails with CodecProcessError, streams whose decoders died with it
    fail too, and a stream started afterwards decodes in a new child as it would have before."""
    seq = _sequences(codec, 1, 60, seed=6)[0]
    pool = DecodePool(codec, threads=1, process=CodecRecipe(model_dir=demo_bundle))
    try:
        pool.wait_ready()

        async def run():
            old = pool.streaming_decoder()
            await pool.push(old, seq[:30])
            pool._workers[0]._process.kill()
            pool._workers[0]._process.wait(10)
            with pytest.raises(CodecProcessError, match="exited"):
                await pool.push(old, seq[30:])
            with pytest.raises(CodecProcessError, match="lost"):
                await pool.push(old, None)
            fresh = pool.streaming_decoder()
            audio, _ = await pool.push(fresh, seq)
            tail, _ = await pool.push(fresh, None)
            return np.concatenate([audio, tail])

        assert np.array_equal(asyncio.run(run()), codec.decode(seq))
        assert pool.snapshot().process_restarts == 1
    finally:
        pool.close()
    assert all(w._process.poll() is not None for w in pool._workers)  # close ends the children


def test_a_codec_process_that_cannot_load_says_why(codec, tmp_path):
    pool = DecodePool(codec, threads=1, process=CodecRecipe(model_dir=tmp_path / "no-such-bundle"))
    try:
        with pytest.raises(CodecProcessError, match="could not load its codec"):
            pool.wait_ready()
    finally:
        pool.close()


def test_codec_process_setting_is_checked(demo_bundle):
    from pcgtts.tts import TTSConfig, TTSService

    with pytest.raises(ValueError, match="codec_process must be one of"):
        TTSService.load(TTSConfig(model_dir=demo_bundle, codec_process="elsewhere"))


def test_a_codec_process_outlives_no_parent(demo_bundle, tmp_path):
    """A server killed outright (SIGKILL: nothing of it runs) leaves no codec process behind: the child sees
    its socket close and exits."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    script = (f"from pcgtts.tts.codec_process import CodecProcess, CodecRecipe\n"
              f"worker = CodecProcess(CodecRecipe(model_dir={str(demo_bundle)!r}))\n"
              f"worker.wait_ready()\n"
              f"open({str(pid_file)!r}, 'w').write(str(worker._process.pid))\n"
              f"import time; time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.1)
        child = int(pid_file.read_text())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(child)
    finally:
        parent.kill()
        parent.wait()


def _running(pid: int) -> bool:
    """Whether pid is a live process (not a zombie: an orphan is reaped by init, or shows state Z)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_model_threads_and_the_codec_process_carry_their_names_to_the_os(tts_service, process_pool):
    """`top -H` / `ps -L` tell the engine's, the codec threads' and the codec process's CPU apart: each
    runs under its own name, as /proc shows it (Linux)."""
    from pathlib import Path

    if not Path("/proc/self/task").exists():
        pytest.skip("no /proc here")
    names = {(task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir()}
    assert {"pcgtts-engine", "pcgtts-codec-0"} <= names
    child = process_pool._workers[0]._process.pid
    assert Path(f"/proc/{child}/comm").read_text().strip() == "pcgtts-codec-p"
