"""X-codec2 through the real `xcodec2` classes (reduced sizes, random weights), loaded from local
directories only: codes at 50 per second, 320 samples per code, windowed streaming, decode-only loading."""

from __future__ import annotations

import socket
import sys

import numpy as np
import pytest
import torch
from pcgtts.engine.codec.base import EncoderUnavailable
from pcgtts.engine.codec.xcodec2 import WindowedStreamingDecoder, XCodec2Codec
from pcgtts.engine.codec.xcodec2.stand_ins import RotaryPositionalEmbeddings
from xcodec2_support import build_codec_dirs, require_xcodec2

RATE, HOP = 16000, 320
# Whole-sequence decoder vs the windowed one (25-frame chunks, 50 frames of context, 25 of look-ahead):
# relative RMS difference 0.037 measured on these random weights (the decoder's attention sees the whole
# window, so every window shifts it a little); the bound leaves a margin. Real weights: not measured here.
STREAM_TOLERANCE = 0.06


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    require_xcodec2()
    return build_codec_dirs(tmp_path_factory.mktemp("xcodec2"))


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """No hub: an empty Hugging Face cache, offline mode, and any non-loopback connection fails."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HOME", str(tmp_path_factory.mktemp("empty-hf-home")))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.delenv("PCGTTS_SEMANTIC_MODEL", raising=False)
    connect = socket.socket.connect

    def loopback_only(sock, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network access to {address}")
        return connect(sock, address)

    mp.setattr(socket.socket, "connect", loopback_only)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def codec(dirs, offline):
    codec_dir, semantic_dir = dirs
    return XCodec2Codec.from_dir(codec_dir, device="cpu", semantic_model=semantic_dir)


def voiced(seconds: float, freq: float = 150.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    wave = sum(np.sin(2 * np.pi * freq * k * t) / k for k in range(1, 6))
    return (0.2 * wave * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def test_stand_ins_are_only_there_while_xcodec2_imports(codec):
    assert "xcodec2.modeling_xcodec2" in sys.modules
    for name in ("torchaudio", "torchtune", "torchtune.modules"):
        module = sys.modules.get(name)
        assert module is None or "pcgtts stand-in" not in (module.__doc__ or "")


def test_rotary_stand_in_is_torchtune_rope():
    """Pairs (x[2j], x[2j+1]) as complex numbers, multiplied by exp(i * p * 10000^(-2j/d)), p = index on
    dim 1: the definition torchtune documents, computed independently of the stand-in."""
    x = torch.randn(2, 5, 3, 8, generator=torch.Generator().manual_seed(0))
    rope = RotaryPositionalEmbeddings(dim=8)
    inv_freq = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = torch.arange(5, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [p, j]
    pairs = torch.view_as_complex(x.double().reshape(2, 5, 3, 4, 2).contiguous())
    expected = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)[None, :, None, :])
    torch.testing.assert_close(rope(x).double(), expected.reshape(2, 5, 3, 8), atol=1e-5, rtol=1e-5)
    assert rope(x.half()).dtype == torch.float16


def test_encode_gives_50_codes_per_second_in_range(codec):
    assert codec.can_encode and not codec.model.training
    for seconds in (1.0, 1.37):
        audio = voiced(seconds)
        codes = codec.encode(audio)
        # xcodec2 pads the clip up to the next multiple of 320 (a whole hop more when already aligned)
        assert codes.shape == (audio.size // HOP + 1,) and codes.dtype == np.int64
        assert codes.min() >= 0 and codes.max() < codec.codebook_size == 65536
        assert len(set(codes.tolist())) > 5  # not one code everywhere
    other = codec.encode(voiced(1.0, freq=260.0))
    assert not np.array_equal(other, codec.encode(voiced(1.0)))
    assert np.array_equal(codec.encode(voiced(1.0)), codec.encode(voiced(1.0)))  # deterministic


def test_decode_gives_320_samples_per_code(codec):
    codes = np.random.default_rng(3).integers(0, 65536, size=37)
    audio = codec.decode(codes)
    assert audio.dtype == np.float32 and audio.shape == (37 * HOP,) and np.isfinite(audio).all()
    assert np.abs(audio).max() > 0
    assert codec.decode(np.zeros(0, np.int64)).size == 0
    assert codec.sample_rate == RATE and codec.hop == HOP


def test_windowed_streaming_joins_close_to_one_decode(codec):
    codes = codec.encode(voiced(3.2))  # 161 frames: 5 chunks with context and look-ahead, then a flush
    whole = codec.decode(codes)
    stream = codec.streaming_decoder()
    assert isinstance(stream, WindowedStreamingDecoder)
    pieces, start = [], 0
    for n in (1, 30, 7, 60, 63):
        pieces.append(stream.push(codes[start:start + n]))
        start += n
    pieces.append(stream.flush())
    streamed = np.concatenate(pieces)
    assert streamed.shape == whole.shape == (codes.size * HOP,)
    rel = np.sqrt(np.mean((streamed - whole) ** 2) / np.mean(whole ** 2))
    print(f"streamed vs whole decode: relative RMS difference {rel:.4f}")
    assert rel < STREAM_TOLERANCE


def test_decode_only_without_semantic_model(dirs, offline):
    codec_dir, _ = dirs
    codec = XCodec2Codec.from_dir(codec_dir, device="cpu")  # nothing given, nothing in the HF cache
    assert not codec.can_encode
    assert codec.decode(np.arange(10)).shape == (10 * HOP,)
    with pytest.raises(EncoderUnavailable, match="w2v-bert-2.0.*--semantic-model"):
        codec.encode(voiced(1.0))


def test_missing_directories_are_named(dirs, offline, tmp_path):
    codec_dir, semantic_dir = dirs
    (tmp_path / "w2v").mkdir()
    (tmp_path / "w2v" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="preprocessor_config.json.*model.safetensors"):
        XCodec2Codec.from_dir(codec_dir, device="cpu", semantic_model=tmp_path / "w2v")
    with pytest.raises(FileNotFoundError, match="local codec directory.*HKUSTAudio/xcodec2"):
        XCodec2Codec.from_dir(semantic_dir.parent / "nothing-here", device="cpu")
    with pytest.raises(FileNotFoundError, match="not an X-codec2 checkpoint"):
        XCodec2Codec.from_dir(tmp_path / "w2v", device="cpu")


def test_semantic_model_from_the_environment(dirs, offline, monkeypatch):
    codec_dir, semantic_dir = dirs
    monkeypatch.setenv("PCGTTS_SEMANTIC_MODEL", str(semantic_dir))
    assert XCodec2Codec.from_dir(codec_dir, device="cpu").can_encode
