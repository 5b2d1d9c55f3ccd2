"""Output encoders, tempo, resampling and upload decoding of the server (real encoders, no mocks)."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest
import soundfile as sf
from pcgtts.server.audio.decode import AudioDecodeError, decode_audio, decode_base64_audio
from pcgtts.server.audio.encoders import (
    UNKNOWN_SIZE,
    float_to_pcm16,
    linear_to_alaw,
    linear_to_ulaw,
    make_encoder,
    wav_header,
)
from pcgtts.server.audio.formats import CONTENT_TYPES, RESPONSE_FORMATS, content_type, output_rate
from pcgtts.server.audio.pipeline import OutputPipeline, Resampler, encode_whole
from server_support import tone

RATE = 16000


G711_DEMUXERS = {"ulaw": "mulaw", "alaw": "alaw"}  # ffmpeg's raw G.711 demuxers


def _decode_any(data: bytes, fmt: str | None = None) -> tuple[np.ndarray, int]:
    """Container bytes -> (mono float32, rate) with PyAV (independent of our own decode path); headerless
    G.711 needs its demuxer named and its rate given."""
    raw = {"format": G711_DEMUXERS[fmt], "options": {"sample_rate": "8000"}} if fmt in G711_DEMUXERS else {}
    with av.open(io.BytesIO(data), **raw) as container:
        rate = container.streams.audio[0].codec_context.sample_rate
        to_float = av.AudioResampler(format="flt", layout="mono", rate=rate)
        audio = [out.to_ndarray().reshape(-1) for frame in container.decode(audio=0)
                 for out in to_float.resample(frame)]
    return np.concatenate(audio), rate


def _stream(fmt: str, audio: np.ndarray, chunk: int, **kw) -> list[bytes]:
    pipe = OutputPipeline(fmt, RATE, **kw)
    parts = [pipe.process(audio[i:i + chunk]) for i in range(0, audio.size, chunk)]
    return parts + [pipe.finish()]


def test_pcm16_is_little_endian_clipped_and_rounded():
    data = float_to_pcm16(np.array([0.0, 0.5, -1.0, 2.0, -3.0, 1 / 65534], np.float32))
    assert struct.unpack("<6h", data) == (0, 16384, -32767, 32767, -32767, 0)


def test_streamed_wav_has_one_header_with_unknown_sizes():
    enc = make_encoder("wav", 24000)
    first, second = enc.encode(np.zeros(10, np.float32)), enc.encode(np.zeros(5, np.float32))
    tail = enc.finish()
    assert first[:4] == b"RIFF" and first[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", first[4:8])[0] == struct.unpack("<I", first[40:44])[0] == UNKNOWN_SIZE
    assert struct.unpack("<IHHIIHH", first[16:36]) == (16, 1, 1, 24000, 48000, 2, 16)
    assert len(first) == 44 + 20 and len(second) == 10 and tail == b""
    # A reader that honours the header still gets the samples (soundfile stops at end of data).
    audio, rate = sf.read(io.BytesIO(first + second), dtype="int16")
    assert rate == 24000 and audio.size == 15


def test_known_length_wav_header_matches_soundfile():
    audio = tone(0.5, RATE)
    data = encode_whole("wav", audio, RATE)
    assert data[:44] == wav_header(24000, (len(data) - 44) // 2)
    decoded, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 24000 and abs(decoded.size - 12000) <= 1


@pytest.mark.parametrize("fmt", RESPONSE_FORMATS)
def test_every_format_streams_and_decodes_to_the_right_length(fmt):
    audio = tone(1.5, RATE)
    parts = _stream(fmt, audio, 1600)
    data = b"".join(parts)
    # Bytes leave before the end: a real stream, not one blob at finish().
    assert sum(1 for p in parts[:-1] if p) >= 5
    if fmt == "pcm":
        decoded, rate = np.frombuffer(data, "<i2").astype(np.float32) / 32768, 24000
    else:
        decoded, rate = _decode_any(data, fmt)
    assert rate == output_rate(fmt) or fmt == "opus"  # Opus decoders run at 48 kHz
    expected = 1.5 * rate
    # Lossy codecs add encoder delay and frame padding (aac: 1024 priming + up to 1024 padding samples).
    assert expected - 2 <= decoded.size <= expected + 0.1 * rate, (fmt, decoded.size, expected)
    assert np.sqrt(np.mean(decoded ** 2)) == pytest.approx(np.sqrt(np.mean(audio ** 2)), rel=0.25)


def test_content_types_and_pcm_rate():
    assert set(CONTENT_TYPES) == set(RESPONSE_FORMATS)
    assert content_type("mp3") == "audio/mpeg" and content_type("opus") == "audio/opus"
    assert content_type("pcm") == "audio/pcm;rate=24000"
    assert content_type("ulaw") == "audio/basic" and output_rate("ulaw") == output_rate("alaw") == 8000


@pytest.mark.parametrize(("law", "reference"), [("ulaw", "lin2ulaw"), ("alaw", "lin2alaw")])
def test_g711_matches_cpython_audioop_on_every_sample_value(law, reference):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import audioop  # CPython's C implementation of G.711 (deprecated, still in 3.11/3.12)
    values = np.arange(-32768, 32768, dtype=np.int32)
    ours = (linear_to_ulaw if law == "ulaw" else linear_to_alaw)(values)
    assert ours.tobytes() == getattr(audioop, reference)(values.astype("<i2").tobytes(), 2)


def test_chunked_resampling_equals_one_shot():
    audio = tone(1.0, RATE)
    streamed = Resampler(RATE, 24000)
    pieces = [streamed.process(audio[i:i + 777]) for i in range(0, audio.size, 777)]
    pieces.append(streamed.process(np.zeros(0, np.float32), last=True))
    chunked = np.concatenate(pieces)
    whole = Resampler(RATE, 24000).process(audio, last=True)
    assert chunked.size == whole.size == 24000
    assert np.max(np.abs(chunked - whole)) < 1e-5


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 4.0])
def test_speed_changes_duration_not_pitch(speed):
    audio = tone(2.0, RATE, freq=200.0)
    pcm = np.frombuffer(b"".join(_stream("pcm", audio, 1600, speed=speed)), "<i2").astype(np.float32)
    assert pcm.size == pytest.approx(2.0 * 24000 / speed, rel=0.05)  # atempo trims a little at the end
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(pcm.size)))
    peak_hz = np.argmax(spectrum) * 24000 / pcm.size
    assert peak_hz == pytest.approx(200.0, rel=0.05)


@pytest.mark.parametrize("container", ["WAV", "FLAC", "OGG", "MP3"])
def test_uploads_decode_to_mono_float(container):
    stereo = np.stack([tone(1.2, 22050), tone(1.2, 22050)], axis=1)
    buf = io.BytesIO()
    sf.write(buf, stereo, 22050, format=container)
    decoded = decode_audio(buf.getvalue())
    assert decoded.sample_rate == 22050 and decoded.samples.ndim == 1
    assert decoded.duration == pytest.approx(1.2, abs=0.06)


def _streaminfo_total_samples(flac: bytes) -> int:
    """The 36-bit total-samples field of STREAMINFO (the first metadata block after "fLaC")."""
    assert flac[:4] == b"fLaC" and flac[4] & 0x7F == 0  # block type 0: STREAMINFO
    return int.from_bytes(flac[18:26], "big") & ((1 << 36) - 1)


def test_whole_flac_carries_total_samples_and_md5():
    import hashlib

    data = encode_whole("flac", tone(1.0, RATE), RATE)
    audio, rate = sf.read(io.BytesIO(data), dtype="int16")  # libsndfile reads it whole
    assert rate == 24000 and audio.size == 24000
    assert _streaminfo_total_samples(data) == sf.info(io.BytesIO(data)).frames == 24000
    assert data[26:42] == hashlib.md5(audio.astype("<i2").tobytes()).digest()


def test_streamed_flac_with_unknown_length_decodes_in_ffmpeg_and_our_upload_path():
    """A streamed FLAC's header goes out before its length is known: total samples 0 ("unknown", allowed by
    the FLAC format). ffmpeg decodes it to the last sample; so does the server's own upload decoder."""
    data = b"".join(_stream("flac", tone(1.0, RATE), 1600))
    assert _streaminfo_total_samples(data) == 0
    audio, rate = _decode_any(data)
    assert rate == 24000 and audio.size == 24000
    assert decode_audio(data).duration == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("data", [b"", b"definitely not audio " * 50, b"RIFF\x00\x00\x00\x00WAVE"])
def test_non_audio_is_rejected(data):
    with pytest.raises(AudioDecodeError):
        decode_audio(data)


def test_base64_and_data_urls():
    raw = b"\x01\x02\x03"
    assert decode_base64_audio("AQID") == raw
    assert decode_base64_audio("data:audio/wav;base64,AQID") == raw
    with pytest.raises(AudioDecodeError):
        decode_base64_audio("not base64!")
