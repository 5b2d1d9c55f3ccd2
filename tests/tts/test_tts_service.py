"""The TTS service the server talks to (tts/service.py): segmentation, long inputs, options, abort."""

from __future__ import annotations

import asyncio
import threading
from contextlib import aclosing
from dataclasses import replace

import numpy as np
import pytest
from pcgtts.tts import InvalidOptions, NothingToSay, SynthesisOptions
from pcgtts.tts.text import split_sentences
from server_support import wait_idle


def test_split_sentences_keeps_order_and_bounds_length():
    text = ("First sentence here. Second one! A third? " + "word " * 120 + "end. Ok. Yes.")
    pieces = split_sentences(text, max_chars=80)
    assert all(len(p) <= 80 for p in pieces)
    assert " ".join(pieces).split() == text.split()  # nothing lost, nothing reordered
    assert pieces[-1].endswith("Ok. Yes.")  # tiny sentences are merged
    assert split_sentences("  \n ") == []


def test_long_input_is_spoken_segment_by_segment(tts_service):
    text = "Sentence one is here. Sentence two is here. And three."
    segments = tts_service.segments(text)
    assert len(segments) >= 2

    async def run():
        synth = tts_service.synthesize(text, None, SynthesisOptions(seed=1))
        chunks = [c async for c in synth]
        return np.concatenate(chunks), synth.stats

    audio, stats = asyncio.run(run())
    assert stats.sentences == len(segments) and stats.finish_reason == "stop"
    assert audio.size == stats.audio_samples and stats.audio_seconds > 0.3 * len(segments)
    # The pause between segments is real silence.
    silent = np.convolve(np.abs(audio) < 1e-6, np.ones(960), "valid") == 960  # 60 ms of zeros
    assert silent.any()


@pytest.mark.parametrize(("options", "param"), [
    (SynthesisOptions(acceptance="nope"), "acceptance"),
    (SynthesisOptions(num_speculative_tokens=7), "num_speculative_tokens"),
    (SynthesisOptions(asg_table="other"), "asg_table"),
])
def test_options_the_engine_cannot_honour_are_refused(tts_service, options, param):
    with pytest.raises(InvalidOptions) as info:
        tts_service.synthesize("Hello.", None, options)
    assert info.value.param == param


def test_per_request_rule_and_target_only_requests_run(tts_service):
    async def run(rule):
        synth = tts_service.synthesize("Hello there.", None, SynthesisOptions(seed=3, acceptance=rule))
        return [c async for c in synth], synth.stats

    for rule in tts_service.acceptance_rules:
        chunks, stats = asyncio.run(run(rule))
        assert chunks and stats.drafted_tokens > 0 and 0 <= stats.accepted_tokens <= stats.drafted_tokens


def test_nothing_to_say(tts_service):
    with pytest.raises(NothingToSay):
        tts_service.synthesize("?!", None)


def test_aclose_aborts_and_frees_kv(tts_service):
    async def run():
        synth = tts_service.synthesize("This sentence is long enough to be cut off in the middle. " * 3, None)
        first = await synth.__anext__()
        await synth.aclose()
        return first, synth.stats

    first, stats = asyncio.run(run())
    assert first.size > 0 and stats.finish_reason == "abort"
    wait_idle(tts_service)  # and its KV freed


def test_decode_threads_keep_each_stream_exact(demo_bundle, tts_service):
    """Streams spread over two codec threads give the same audio as on the shared one-thread service."""
    from pcgtts.tts import TTSConfig, TTSService

    async def many(service):
        async def one(i):
            synth = service.synthesize(f"Stream {i} is here.", None, SynthesisOptions(seed=i))
            return np.concatenate([c async for c in synth])
        return await asyncio.gather(*(one(i) for i in range(3)))

    two = TTSService.load(TTSConfig(model_dir=demo_bundle, decode_threads=2))
    try:
        spread = asyncio.run(many(two))
    finally:
        two.close()
    for a, b in zip(spread, asyncio.run(many(tts_service)), strict=True):
        # same tokens and blocks; only the float rounding of batched FFTs depends on what shares a call
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=2e-3)
        assert np.abs(a - b).mean() < 1e-4


def test_concurrent_streams_share_batched_codec_calls(tts_service):
    """Streams running together are decoded in shared codec calls, and each one's audio is what it
    gets when it runs alone (up to float rounding: batched FFTs round differently, and Griffin-Lim's
    iterations carry that to ~1e-4)."""
    texts = [f"Batch member {i} speaks a sentence." for i in range(4)]

    async def one(i):
        synth = tts_service.synthesize(texts[i], None, SynthesisOptions(seed=i))
        return np.concatenate([c async for c in synth])

    async def together():
        return await asyncio.gather(*(one(i) for i in range(4)))

    before = tts_service.codec_stats()
    shared = asyncio.run(together())
    after = tts_service.codec_stats()
    assert after.stream_jobs - before.stream_jobs > after.calls - before.calls  # some call served >1 stream
    for i, audio in enumerate(shared):
        alone = asyncio.run(one(i))
        assert audio.shape == alone.shape
        np.testing.assert_allclose(audio, alone, atol=2e-3)
        assert np.abs(audio - alone).mean() < 1e-4  # a mixed-up stream differs by ~1e-2


class HeldCodec:
    """The real codec for DecodePool, except that its first batch announces itself (`started`) and waits for
    `release`: jobs pushed meanwhile queue behind it."""

    def __init__(self, codec):
        self.codec = codec
        self.started, self.release = threading.Event(), threading.Event()

    def decode_streams(self, work):
        getattr(self, "codec_calls", []).append(len(work))
        if not self.started.is_set():
            self.started.set()
            self.release.wait(30)
        return self.codec.decode_streams(work)


def test_decode_pool_runs_earliest_deadline_first(tts_service):
    """With the codec thread busy, a queued first chunk (deadline 0) overtakes a stream ahead of playback."""
    from pcgtts.tts.decode_pool import DecodePool

    codec = tts_service.codec
    rng = np.random.default_rng(0)
    long_codes = rng.integers(0, codec.codebook_size, size=500)  # 10 s of audio keeps the thread busy
    codes = rng.integers(0, codec.codebook_size, size=60)
    finished: list[str] = []

    held = HeldCodec(codec)

    async def job(pool, name, deadline):
        await pool.push(codec.streaming_decoder(), long_codes if name == "busy" else codes, deadline)
        finished.append(name)

    async def run():
        pool = DecodePool(held, threads=1)
        try:
            busy = asyncio.create_task(job(pool, "busy", 0.0))
            assert await asyncio.to_thread(held.started.wait, 30)  # the thread is decoding "busy"
            queued = [asyncio.create_task(job(pool, "ahead-of-playback", 1e9)),
                      asyncio.create_task(job(pool, "first-chunk", 0.0))]
            await asyncio.sleep(0)  # one loop turn: each task queues its job (push queues, then awaits)
            held.release.set()
            await asyncio.gather(busy, *queued)
        finally:
            held.release.set()
            pool.close()

    asyncio.run(run())
    assert finished == ["busy", "first-chunk", "ahead-of-playback"]


def test_one_streams_codec_failure_ends_only_that_stream(tts_service):
    """Jobs batched into one codec call with a stream whose codes the codec cannot take (out of its
    codebook): that stream gets the error, the others their audio exactly as when decoded alone."""
    from pcgtts.tts.decode_pool import DecodePool

    codec = tts_service.codec
    rng = np.random.default_rng(1)
    good = [rng.integers(0, codec.codebook_size, size=60) for _ in range(3)]
    bad = np.array([5, codec.codebook_size + 7, 9] * 20)
    held = HeldCodec(codec)
    before = held.codec_calls = []

    async def run():
        pool = DecodePool(held, threads=1)
        try:
            busy = asyncio.create_task(pool.push(codec.streaming_decoder(), good[0]))
            assert await asyncio.to_thread(held.started.wait, 30)  # what follows queues behind it
            decoders = [codec.streaming_decoder() for _ in range(4)]
            jobs = [asyncio.create_task(pool.push(d, c)) for d, c in zip(decoders, [good[0], bad, *good[1:]],
                                                                       strict=True)]
            await asyncio.sleep(0)
            held.release.set()
            await busy
            out = await asyncio.gather(*jobs, return_exceptions=True)
            flushed = [await pool.push(d, None) for i, d in enumerate(decoders) if i != 1]
            return out, flushed
        finally:
            held.release.set()
            pool.close()

    out, flushed = asyncio.run(run())
    assert max(before) == 4  # the four jobs were one batched call, which failed
    assert isinstance(out[1], IndexError)
    for (audio, _), (tail, _), codes in zip([out[0], out[2], out[3]], flushed, [good[0], *good[1:]],
                                            strict=True):
        np.testing.assert_allclose(np.concatenate([audio, tail]), codec.decode(codes), atol=2e-3)


def test_a_codec_failure_fails_its_synthesis_and_the_others_go_on(tts_service):
    """A synthesis whose decoder breaks ends with SynthesisFailed (the server's in-band error); the streams
    sharing codec calls with it finish with their full audio."""
    from pcgtts.tts import SynthesisFailed
    from pcgtts.tts.decode_pool import DecodePool

    codec = tts_service.codec
    poisoned = PoisonedCodec(codec)
    pool, tts_service.decoder = tts_service.decoder, DecodePool(poisoned, threads=1)
    texts = [f"Stream number {i} keeps on talking." for i in range(3)]

    async def one(i):
        synth = tts_service.synthesize(texts[i], None, SynthesisOptions(seed=i))
        return np.concatenate([c async for c in synth])

    async def together():
        return await asyncio.gather(*(one(i) for i in range(3)), return_exceptions=True)

    try:
        results = asyncio.run(together())
    finally:
        tts_service.decoder.close()
        tts_service.decoder = pool
    failed = [i for i, r in enumerate(results) if isinstance(r, SynthesisFailed)]
    assert poisoned.poisoned is not None  # some codec call was shared, and the poisoned stream's first was
    assert len(failed) == 1 and "IndexError" in str(results[failed[0]])
    for i in {0, 1, 2} - set(failed):
        np.testing.assert_allclose(results[i], asyncio.run(one(i)), atol=2e-3)
    wait_idle(tts_service)


class PoisonedCodec:
    """The real codec, except that the first stream it sees in a batched call is broken from then on: every
    call holding it raises IndexError (as the real codec does on a code outside its codebook; the pool
    test above feeds it such codes), so that stream's failure first happens inside a shared call."""

    def __init__(self, codec):
        self.codec = codec
        self.poisoned = None

    def __getattr__(self, name):
        return getattr(self.codec, name)

    def decode_streams(self, work):
        if self.poisoned is None and len(work) > 1:
            self.poisoned = work[0][0]
        if any(d is self.poisoned for d, _ in work):
            raise IndexError("index out of range in self")
        return self.codec.decode_streams(work)


def test_requests_pick_their_asg_table_and_draft_length(demo_bundle, tmp_path):
    """A/B tests in one server: a request names one of the loaded ASG tables, or verifies fewer drafts
    than the engine's γ."""
    from pcgtts.asg_tables import ASGTable
    from pcgtts.tts import TTSConfig, TTSService

    service = TTSService.load(TTSConfig(model_dir=demo_bundle))
    vocab = service.engine.vocab_size
    service.close()
    ASGTable.from_groups([list(range(vocab))], vocab).save(tmp_path / "everything.asg")
    service = TTSService.load(TTSConfig(model_dir=demo_bundle,
                                        extra_asg_tables={"everything": tmp_path / "everything.asg"}))
    try:
        names = service.capabilities()["asg_tables"]
        assert names[0] == service.asg_table_name and names[-1] == "everything"  # default first, --extra last

        async def run(**options):
            synth = service.synthesize("Hello there, how are you?", None, SynthesisOptions(seed=4, **options))
            [c async for c in synth]
            return synth.stats

        # one group over every token: P_c = Q_c = 1, so every draft is accepted
        assert asyncio.run(run(asg_table="everything")).acceptance_rate == 1.0
        assert asyncio.run(run()).acceptance_rate < 0.9
        # γ = 1: a sentence's first token is its prefill's (no draft); every later step drafts one token and
        # emits it or a replacement, plus a bonus when it is accepted; a sentence's last step may stop (its
        # stop token) before that bonus
        one = asyncio.run(run(num_speculative_tokens=1))
        assert one.drafted_tokens > 0 and one.steps == one.drafted_tokens + one.sentences
        assert one.accepted_tokens + one.drafted_tokens <= one.generated_tokens
        assert one.generated_tokens <= one.accepted_tokens + one.drafted_tokens + one.sentences
    finally:
        service.close()


def test_uploaded_voices_are_pinned_like_presets(tts_service):
    """A request in a voice that is not a preset (an uploaded one) pins that voice's prompt prefix in the
    engine's prefix cache (lru among such voices); the next request in it finds the prefix cached."""
    from pcgtts.tts import VoicePrompt

    preset = next(iter(tts_service.preset_voices().values()))
    uploaded = VoicePrompt(codes=np.asarray(preset.codes)[::-1].copy(), transcript="someone else says this")

    def speak(voice, seed):
        async def run():
            synth = tts_service.synthesize("A voice of its own speaks.", voice, SynthesisOptions(seed=seed))
            return [c async for c in synth]
        asyncio.run(run())
        wait_idle(tts_service)
        return tts_service.engine_stats()

    before = speak(preset, 1)
    first = speak(uploaded, 2)
    prefix = len(tts_service._voice_prefix(uploaded))
    block = tts_service.engine.config.block_size
    assert first.kv_blocks_pinned - before.kv_blocks_pinned == prefix // block > 0
    again = speak(uploaded, 3)
    assert again.prefix_cache_hits - first.prefix_cache_hits >= prefix // block * block
    assert again.kv_blocks_pinned == first.kv_blocks_pinned


def first_chunk_under(tts_service, monkeypatch, hold_s: float, step_delay_s: float):
    """A seeded synthesis with first-audio holds up to `hold_s`, its engine deltas delayed by
    `step_delay_s` each (a loaded engine) -> (first chunk, tokens generated when it left, all its audio,
    its stats)."""
    monkeypatch.setattr(tts_service, "config", replace(tts_service.config, first_audio_max_hold_s=hold_s))
    engine_stream = tts_service.engine.stream

    async def slowed(*args, **kwargs):
        async with aclosing(engine_stream(*args, **kwargs)) as deltas:
            async for delta in deltas:
                await asyncio.sleep(step_delay_s)
                yield delta

    monkeypatch.setattr(tts_service.engine, "stream", slowed)

    async def run():
        synth = tts_service.synthesize("The first block should leave at once, please.", None,
                                       SynthesisOptions(seed=5))
        chunks, taken = [], None
        async for chunk in synth:
            taken = synth.stats.generated_tokens if taken is None else taken
            chunks.append(chunk)
        return chunks[0], taken, np.concatenate(chunks), synth.stats

    try:
        return asyncio.run(run())
    finally:
        monkeypatch.undo()
        wait_idle(tts_service)


def test_first_audio_leaves_with_the_first_block_unless_the_next_would_come_late(tts_service, monkeypatch):
    """Unheld, the first chunk is yielded as soon as the codec's first block is decoded (only a few
    milliseconds of each sentence are held back to fade its end), not when the second block is. A stream
    whose next block would come after the first one has played (here ~20 engine steps a second, ~3 codes a
    step: the second block's 24 codes take longer than the first block's 0.3 s) has its first audio held
    until it can follow; the audio is the same samples either way."""
    codec = tts_service.codec
    gl, ctx = codec.gl, codec.decoder.context
    second_block_needs = gl.bounds(1)[1] + gl.right + ctx

    chunk, taken, audio, stats = first_chunk_under(tts_service, monkeypatch, hold_s=0.0, step_delay_s=0.0)
    assert taken < second_block_needs and stats.first_audio_held_s == 0
    assert chunk.size >= gl.first_block * codec.spec.hop - gl.crossfade // 2 - int(0.005 * codec.sample_rate)

    _, _, fast_audio, _ = first_chunk_under(tts_service, monkeypatch, hold_s=5.0, step_delay_s=0.0)
    held_chunk, held_taken, held_audio, held = first_chunk_under(tts_service, monkeypatch, hold_s=5.0,
                                                                 step_delay_s=0.05)
    assert held.first_audio_held_s > 0.05 and held_taken > taken
    assert np.array_equal(held_audio, audio) and np.array_equal(fast_audio, audio)
    assert held_chunk.size >= chunk.size
