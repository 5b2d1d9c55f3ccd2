"""The demo mel codec: shapes, round-trip quality, streaming == whole decode, seamless joins."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import soxr
import torch
from pcgtts.engine.codec.demo.codec import DemoMelCodec
from pcgtts.engine.codec.demo.features import HOP, SAMPLE_RATE
from pcgtts.engine.speech.demo.espeak import ESPEAK_RATE, Voice, synthesize
from pcgtts.recipes.demo.fit_codec import fit_kmeans
from pcgtts.tts.bundle import DEFAULT_MODEL_DIR

TEXT = "Please call Stella and ask her to bring these things."


def espeak_16k(text: str, voice: Voice) -> np.ndarray:
    return soxr.resample(synthesize(text, voice).audio, ESPEAK_RATE, SAMPLE_RATE).astype(np.float32)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Griffin-Lim's small FFTs gain nothing from threads, and on a busy 2-core box threads thrash."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def small_codec() -> DemoMelCodec:
    """A 96-code codebook fitted on a few espeak-ng sentences (not including TEXT)."""
    base = DemoMelCodec(torch.zeros(1, 80))
    texts = ["The quick brown fox jumps over the lazy dog.", "Rice is often served in round bowls.",
             "A large size in stockings is hard to sell.", "Four hours of steady work faced us."]
    frames = torch.cat([base.features(espeak_16k(t, Voice(v))) for t in texts for v in ("en-us", "en-us+f2")])
    return DemoMelCodec(fit_kmeans(frames, 96, iterations=10, seed=0))


@pytest.fixture(scope="module")
def utterance() -> np.ndarray:
    return espeak_16k(TEXT, Voice("en-us+m3"))


@pytest.fixture(scope="module")
def whole(small_codec, utterance) -> tuple[np.ndarray, np.ndarray]:
    """(codes, whole-sequence decode) of the test utterance."""
    codes = small_codec.encode(utterance)
    return codes, small_codec.decode(codes)


def test_shapes(small_codec, utterance, whole):
    codes, audio = whole
    assert codes.dtype == np.int64 and codes.shape == (len(utterance) // HOP,)
    assert codes.min() >= 0 and codes.max() < small_codec.codebook_size
    assert audio.dtype == np.float32 and audio.shape == (len(codes) * HOP,)
    assert small_codec.decode(np.zeros(0, np.int64)).shape == (0,)


def _mel_distance(codec: DemoMelCodec, a: np.ndarray, b: np.ndarray) -> float:
    fa, fb = codec.features(a), codec.features(b)
    n = min(len(fa), len(fb))
    return float((fa[:n] - fb[:n]).abs().mean())


def test_round_trip_is_close_to_the_original(small_codec, utterance, whole):
    codes, rebuilt = whole
    dist = _mel_distance(small_codec, utterance, rebuilt)
    # the same codes in a scrambled order decode to audio of the same sounds, in the wrong places
    scrambled = small_codec.decode(np.random.default_rng(0).permutation(codes))
    assert dist < 0.9  # nats of log-mel; measured ~0.6 with 96 codes fitted on 4 sentences
    assert dist < 0.6 * _mel_distance(small_codec, utterance, scrambled)


@pytest.mark.parametrize("chunk", [1, 33, "random"])
def test_streaming_equals_whole_decode(small_codec, whole, chunk):
    codes, audio = whole
    rng = np.random.default_rng(1)
    stream, parts, pos = small_codec.streaming_decoder(), [], 0
    while pos < len(codes):
        n = int(rng.integers(1, 40)) if chunk == "random" else chunk
        parts.append(stream.push(codes[pos:pos + n]))
        pos += n
    parts.append(stream.flush())
    streamed = np.concatenate(parts)
    assert streamed.shape == audio.shape
    np.testing.assert_allclose(streamed, audio, atol=1e-5)


def test_first_block_is_small_and_blocks_ramp_up(small_codec, whole):
    codes, audio = whole
    gl, ctx = small_codec.gl, small_codec.decoder.context
    assert replace(gl, block=32).boundaries(200) == [8, 24, 56, 88, 120, 152, 184]  # 8, 16, then 32s
    assert gl.boundaries(60) == [8, 24, 40, 56]  # 8, then 16s
    stream = small_codec.streaming_decoder()
    needed = gl.first_block + gl.right + ctx  # codes before the first audio comes out
    assert stream.push(codes[: needed - 1]).size == 0
    first = stream.push(codes[needed - 1: needed])
    assert 0 < first.size <= gl.first_block * HOP
    np.testing.assert_allclose(first, audio[: first.size], atol=1e-5)


@pytest.mark.parametrize("which", ["centroids", "shipped"])
def test_streams_decoded_together_equal_each_alone(small_codec, whole, utterance, which):
    """decode_streams batches blocks of equal size across streams; each stream's audio is the same bits as
    decoded alone, whatever shares the call (the conv decoder of the shipped codec runs window by window,
    the batched Griffin-Lim normalises block by block: a seed fixes the audio, not only the tokens)."""
    if which == "shipped":
        if not (DEFAULT_MODEL_DIR / "codec").exists():
            pytest.skip("embedded model not built yet")
        codec = DemoMelCodec.from_dir(DEFAULT_MODEL_DIR / "codec")
        codes = codec.encode(utterance)
    else:
        codec, codes = small_codec, whole[0]
    others = [codes[::-1].copy(), codes[: len(codes) // 2], codec.encode(utterance[::2]), codes[5:].copy()]
    seqs = [codes, *others]
    alone = [codec.decode(c) for c in seqs]
    streams = [codec.streaming_decoder() for _ in seqs]
    parts: list[list[np.ndarray]] = [[] for _ in seqs]
    rng = np.random.default_rng(2)
    pos = [0] * len(seqs)
    while any(p < len(c) for p, c in zip(pos, seqs, strict=True)):
        work, idx = [], []
        for i, (s, c) in enumerate(zip(streams, seqs, strict=True)):
            if pos[i] < len(c) and rng.random() < 0.8:  # not every stream has codes every step
                n = int(rng.integers(1, 12))
                work.append((s, c[pos[i]: pos[i] + n]))
                idx.append(i)
                pos[i] += n
        for i, a in zip(idx, codec.decode_streams(work), strict=True):
            parts[i].append(a)
    for i, a in enumerate(codec.decode_streams([(s, None) for s in streams])):
        parts[i].append(a)
    for got, want in zip(parts, alone, strict=True):
        np.testing.assert_array_equal(np.concatenate(got), want)


def test_block_joins_have_no_jumps(small_codec, whole):
    codes, audio = whole
    step = np.abs(np.diff(audio))
    half = small_codec.gl.crossfade // 2
    joins = [b * HOP - half + i for b in small_codec.gl.boundaries(len(codes)) for i in (-1, 0, 1)]
    # sample-to-sample change at the cross-fade edges stays within the signal's ordinary range
    assert step[joins].max() <= np.quantile(step, 0.999)


@pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "codec").exists(), reason="embedded model not built yet")
def test_shipped_codec_round_trip(utterance):
    codec = DemoMelCodec.from_dir(DEFAULT_MODEL_DIR / "codec")
    assert codec.sample_rate == 16000 and codec.frame_rate == 50
    rebuilt = codec.decode(codec.encode(utterance))
    assert rebuilt.shape == (len(utterance) // HOP * HOP,)
    assert _mel_distance(codec, utterance, rebuilt) < 0.6


def test_first_block_with_less_conv_lookahead_streams_like_whole_decode():
    """The shipped codec decodes a 16-frame first block reading no conv context past its Griffin-Lim
    look-ahead: its first audio needs the same 22 codes as an 8-frame block with full context but holds
    twice the audio, streaming in any chunking still equals the whole decode, and codes after the 22nd
    cannot change the first block."""
    codec = DemoMelCodec.from_dir(DEFAULT_MODEL_DIR / "codec")
    gl = codec.gl
    assert gl.first_context == 0 and codec.decoder.context > 0
    needed = gl.first_block + gl.right  # codes before the first audio comes out
    old = replace(gl, first_block=8, first_context=None)
    assert needed == old.first_block + old.right + codec.decoder.context == 22
    codes = np.random.default_rng(3).integers(0, codec.codebook_size, size=120)
    whole = codec.decode(codes)
    stream = codec.streaming_decoder()
    assert stream.push(codes[: needed - 1]).size == 0
    first = stream.push(codes[needed - 1: needed])
    assert first.size == gl.first_block * HOP - gl.crossfade // 2
    np.testing.assert_allclose(first, whole[: first.size], atol=1e-5)
    rng, parts, pos = np.random.default_rng(4), [first], needed
    while pos < len(codes):
        n = int(rng.integers(1, 30))
        parts.append(stream.push(codes[pos:pos + n]))
        pos += n
    parts.append(stream.flush())
    np.testing.assert_allclose(np.concatenate(parts), whole, atol=1e-5)
    other = np.concatenate([codes[:needed], (codes[needed:] + 7) % codec.codebook_size])
    np.testing.assert_allclose(codec.decode(other)[: first.size], first, atol=1e-6)


@pytest.mark.filterwarnings("ignore:The length of signal is shorter")  # istft's own, for the padded case
@pytest.mark.parametrize("frames", [1, 2, 9, 28, 56, 73])
def test_inverse_stft_is_torch_istft_bit_for_bit(frames):
    """Griffin-Lim's inverse STFT (the window's overlap-add kept per shape) gives torch.istft's samples
    exactly, at the codec's lengths and past the signal's end (zeros there, as istft pads)."""
    from pcgtts.engine.codec.demo.features import N_FFT
    from pcgtts.engine.codec.demo.griffinlim import UPSAMPLE, inverse_stft, window_envelope

    g = torch.Generator().manual_seed(frames)
    spectra = torch.complex(torch.randn(N_FFT // 2 + 1, frames, generator=g),
                            torch.randn(N_FFT // 2 + 1, frames, generator=g))
    window, hop = torch.hann_window(N_FFT), HOP // UPSAMPLE
    for length in (frames * hop, frames * hop + N_FFT):
        expected = torch.istft(spectra, N_FFT, hop, window=window, center=True, length=length)
        for _ in range(2):  # the envelope computed, then reused
            envelope = window_envelope(window, hop, frames)
            assert torch.equal(inverse_stft(spectra, window, hop, length, envelope), expected)
