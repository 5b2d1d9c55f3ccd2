"""The X-codec2 adapter: clear errors without the optional package, and its windowed streaming decoder."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from pcgtts.engine.codec.xcodec2 import WindowedStreamingDecoder, XCodec2Codec
from pcgtts.tts.bundle import CODECS, ModelBundle

HOP = 4


def local_decode(codes: np.ndarray) -> np.ndarray:
    """A decoder with a receptive field of 3 frames each side: frame i's samples mix codes[i-3..i+3]."""
    codes = np.asarray(codes, dtype=np.float64)
    padded = np.pad(codes, 3)
    weights = np.array([1, -2, 3, 5, 3, -2, 1], dtype=np.float64)
    mixed = np.convolve(padded, weights, mode="valid")  # [frames]
    ramp = np.arange(1, HOP + 1)
    return (mixed[:, None] * ramp[None, :]).reshape(-1).astype(np.float32)


def test_windowed_streaming_equals_whole_decode_for_local_decoders():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 1000, size=203)
    whole = local_decode(codes)
    for pieces in ([203], [1] * 203, [7, 30, 1, 100, 65]):
        stream = WindowedStreamingDecoder(local_decode, HOP, chunk=10, context=3, lookahead=3)
        out, start = [], 0
        for n in pieces:
            out.append(stream.push(codes[start:start + n]))
            start += n
        out.append(stream.flush())
        assert np.array_equal(np.concatenate(out), whole)
    stream = WindowedStreamingDecoder(local_decode, HOP, chunk=10, context=3, lookahead=3)
    assert stream.push(codes[:12]).size == 0  # 10-frame chunk waits for 3 frames of look-ahead
    assert stream.push(codes[12:13]).size == 10 * HOP


def test_xcodec2_codec_is_registered_and_fails_clearly(tmp_path):
    assert CODECS["xcodec2"] == "pcgtts.engine.codec.xcodec2:XCodec2Codec"
    bundle = ModelBundle.from_dir(tmp_path, codec_dir=None)
    assert bundle.codec_name == "xcodec2"
    with pytest.raises(FileNotFoundError):
        bundle.load_codec()
    if importlib.util.find_spec("xcodec2") is None:
        with pytest.raises(ImportError, match="make install-xcodec2"):
            XCodec2Codec.from_dir(tmp_path)
