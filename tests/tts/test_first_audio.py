"""First-audio pacing: the decoders say how many codes their next audio needs, and a stream's first audio
is held back exactly while the next chunk is predicted to come after it runs out."""

from __future__ import annotations

import numpy as np
import pytest
from pcgtts.engine.codec.xcodec2 import WindowedStreamingDecoder
from pcgtts.tts.first_audio import FirstAudioPacer

RATE = 1000  # samples per second of the pacer's audio in these tests


def pushes_until_audio(decoder, codes: np.ndarray) -> list[int]:
    """Feeds codes one at a time -> how many each audio-bearing push needed, as announced just before."""
    announced, out = [], []
    for i, code in enumerate(codes):
        if i == 0 or out[-1]:
            announced.append(decoder.codes_until_audio())
            fed = 0
        fed += 1
        out.append(decoder.push(np.asarray([code])).size > 0)
        if out[-1]:
            assert fed == announced[-1], f"announced {announced[-1]} codes, audio came after {fed}"
    return announced


def test_demo_decoder_announces_the_codes_each_block_needs(demo_bundle):
    from pcgtts.tts.bundle import ModelBundle

    codec = ModelBundle.from_dir(demo_bundle).load_codec()
    gl, ctx = codec.gl, codec.decoder.context
    decoder = codec.streaming_decoder()
    announced = pushes_until_audio(decoder, np.arange(120) % codec.codebook_size)
    # block 0 reads `first_context` frames of the conv decoder's look-ahead, every later block all of it
    first = gl.bounds(0)[1] + gl.right + (ctx if gl.first_context is None else min(ctx, gl.first_context))
    assert announced[:3] == [first, gl.bounds(1)[1] + gl.right + ctx - first, gl.block]
    assert decoder.codes_until_audio() > 0


def test_windowed_decoder_announces_the_codes_each_chunk_needs():
    decoder = WindowedStreamingDecoder(lambda c: np.ones(len(c) * 4, np.float32), 4, chunk=10, context=3,
                                       lookahead=3)
    assert pushes_until_audio(decoder, np.arange(60))[:3] == [13, 10, 10]


def pacer_after(codes_per_step: int, step_s: float, steps: int, max_hold_s: float = 10.0) -> FirstAudioPacer:
    pacer = FirstAudioPacer(max_hold_s, RATE)
    for k in range(steps):
        pacer.codes_arrived(codes_per_step, k * step_s)
    return pacer


def test_a_fast_stream_gets_its_first_audio_at_once():
    pacer = pacer_after(codes_per_step=3, step_s=0.01, steps=8)  # 300 codes/s
    now = 0.07
    assert pacer.code_rate(now) == pytest.approx(21 / 0.07)
    pacer.hold(np.ones(300, np.float32), now)  # 0.3 s of audio; the next needs 24 codes: 0.08 s + 0.02
    out = pacer.release(24, 0.02, now)
    assert out is not None and out.size == 300 and pacer.held_s == 0.0


def test_a_slow_stream_holds_its_first_audio_until_the_next_chunk_can_follow():
    pacer = pacer_after(codes_per_step=3, step_s=0.05, steps=8)  # 60 codes/s
    now = 0.35
    pacer.hold(np.ones(300, np.float32), now)  # 0.3 s of audio, 24 codes needed: 0.4 s + 0.02 s
    assert pacer.release(24, 0.02, now) is None
    for k, needed in ((8, 21), (9, 18)):  # 18 codes / 60 per s + 0.02 = 0.32 s: still too late
        pacer.codes_arrived(3, k * 0.05)
        pacer.hold(np.zeros(0, np.float32), k * 0.05)
        assert pacer.release(needed, 0.02, k * 0.05) is None
    pacer.codes_arrived(3, 0.5)
    pacer.hold(np.full(50, 2, np.float32), 0.5)  # a later piece held with the first, in order
    out = pacer.release(15, 0.02, 0.5)  # 0.25 s + 0.02 <= 0.35 s held
    assert out is not None and out.size == 350 and (out[300:] == 2).all()
    assert pacer.held_s == pytest.approx(0.15)


def test_the_hold_ends_at_its_limit_or_when_the_decoder_cannot_say():
    pacer = pacer_after(codes_per_step=1, step_s=0.1, steps=5, max_hold_s=0.2)  # 10 codes/s
    pacer.hold(np.ones(100, np.float32), 0.4)
    assert pacer.release(30, 0.0, 0.5) is None
    assert pacer.release(30, 0.0, 0.61).size == 100  # held 0.21 s: out, however slow the stream
    other = pacer_after(codes_per_step=1, step_s=0.1, steps=5)
    other.hold(np.ones(100, np.float32), 0.4)
    assert other.release(None, 0.0, 0.4).size == 100
    assert FirstAudioPacer(1.0, RATE).release(30, 0.0, 0.0) is None  # nothing decoded yet: nothing to send
