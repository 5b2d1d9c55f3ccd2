"""Incremental audio encoders: float32 chunks in, bytes of the target container out as they are ready.

`make_encoder(fmt, sample_rate)` gives an `AudioEncoder`. Call `encode(chunk)` for every chunk and
`finish()` once; each returns the bytes that can go to the client now. WAV uses one RIFF header whose
size fields are 0xFFFFFFFF (the streaming convention OpenAI uses), unless the total length is known up
front. mp3, Ogg Opus, AAC (ADTS) and FLAC come from the real ffmpeg encoders through PyAV. Streamed, they
are written to a non-seekable sink so that every muxed packet can leave at once; a whole file
(`whole=True`) goes to a seekable buffer, so the muxer can go back and complete its header (FLAC's
STREAMINFO gets the total sample count and the audio's MD5, which libsndfile needs).
"""

from __future__ import annotations

import io
import struct
from abc import ABC, abstractmethod

import av
import numpy as np

UNKNOWN_SIZE = 0xFFFFFFFF


def float_to_pcm16(audio: np.ndarray) -> bytes:
    """float32 [n] in [-1, 1] -> int16 little-endian bytes (clipped, rounded)."""
    scaled = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767.0
    return np.rint(scaled).astype("<i2").tobytes()


def wav_header(sample_rate: int, num_samples: int | None = None) -> bytes:
    """A 44-byte RIFF/WAVE header for mono 16-bit PCM; unknown length -> 0xFFFFFFFF size fields."""
    if num_samples is None:
        riff_size = data_size = UNKNOWN_SIZE
    else:
        data_size = num_samples * 2
        riff_size = 36 + data_size
    return (b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data_size))


class AudioEncoder(ABC):
    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate

    @abstractmethod
    def encode(self, audio: np.ndarray) -> bytes:
        """audio: float32 [n] at `sample_rate` -> bytes ready to send (possibly empty)."""

    @abstractmethod
    def finish(self) -> bytes:
        """Flush the encoder; the returned bytes end the stream."""


class PCMEncoder(AudioEncoder):
    def encode(self, audio: np.ndarray) -> bytes:
        return float_to_pcm16(audio)

    def finish(self) -> bytes:
        return b""


class WavEncoder(AudioEncoder):
    """One header, then raw PCM. `num_samples` known -> exact sizes, else the streaming 0xFFFFFFFF form."""

    def __init__(self, sample_rate: int, num_samples: int | None = None):
        super().__init__(sample_rate)
        self._header: bytes | None = wav_header(sample_rate, num_samples)

    def encode(self, audio: np.ndarray) -> bytes:
        head, self._header = self._header or b"", None
        return head + float_to_pcm16(audio)

    def finish(self) -> bytes:
        head, self._header = self._header or b"", None
        return head  # an empty stream still gets its header


class _Sink:
    """A write-only, non-seekable file object collecting what the muxer writes."""

    def __init__(self):
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


# fmt -> (container, encoder, container options, codec options)
_AV_SPECS: dict[str, tuple[str, str, dict[str, str], dict[str, str]]] = {
    "mp3": ("mp3", "libmp3lame", {}, {}),
    # Ogg pages are flushed every 20 ms instead of every second, so Opus streams without stalling.
    "opus": ("ogg", "libopus", {"page_duration": "20000"}, {}),
    "aac": ("adts", "aac", {}, {}),
    "flac": ("flac", "flac", {}, {}),
}
_BIT_RATES = {"mp3": 64_000, "opus": 32_000, "aac": 64_000}


class PyAVEncoder(AudioEncoder):
    """whole: the bytes are sent only once `finish()` returns (a whole-file response), so the container is
    written to a seekable buffer and its header rewritten at the end; else packets leave as muxed."""

    def __init__(self, fmt: str, sample_rate: int, *, whole: bool = False):
        super().__init__(sample_rate)
        container, codec, container_opts, codec_opts = _AV_SPECS[fmt]
        self._whole = io.BytesIO() if whole else None
        self._sink = self._whole if whole else _Sink()
        self._container = av.open(self._sink, mode="w", format=container, options=container_opts)
        self._stream = self._container.add_stream(codec, rate=sample_rate, options=codec_opts)
        self._stream.layout = "mono"
        if fmt in _BIT_RATES:
            self._stream.bit_rate = _BIT_RATES[fmt]
        self._lossless = fmt == "flac"
        self._pts = 0
        self._closed = False

    def encode(self, audio: np.ndarray) -> bytes:
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        if audio.size:
            if self._lossless:  # the very 16-bit samples of pcm and wav (ffmpeg would round its own way)
                pcm = np.frombuffer(float_to_pcm16(audio), dtype="<i2")
                frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
            else:
                frame = av.AudioFrame.from_ndarray(audio[None, :], format="flt", layout="mono")
            frame.sample_rate = self.sample_rate
            frame.pts = self._pts
            self._pts += audio.size
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return b"" if self._whole is not None else self._sink.take()

    def finish(self) -> bytes:
        if not self._closed:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()  # seekable: the muxer rewrites the header here
            self._closed = True
        return self._whole.getvalue() if self._whole is not None else self._sink.take()


def _pcm16_values(audio: np.ndarray) -> np.ndarray:
    """float [-1, 1] -> int32 array of the 16-bit sample values `float_to_pcm16` writes."""
    return np.frombuffer(float_to_pcm16(audio), dtype="<i2").astype(np.int32)


def _segment(magnitude: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """G.711 segment: the first i with magnitude <= ends[i] (len(ends) when above all)."""
    return np.searchsorted(ends, magnitude, side="left")


_ULAW_ENDS = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_ALAW_ENDS = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])


def linear_to_ulaw(pcm: np.ndarray) -> np.ndarray:
    """16-bit linear samples (int array) -> G.711 mu-law bytes (uint8), ITU-T G.711 segment coding."""
    x = pcm >> 2  # 14-bit
    mask = np.where(x < 0, 0x7F, 0xFF)
    x = np.minimum(np.abs(x), 8159) + 0x21  # clip, add the bias (0x84 >> 2)
    seg = _segment(x, _ULAW_ENDS)
    code = (np.minimum(seg, 7) << 4) | ((x >> (np.minimum(seg, 7) + 1)) & 0xF)
    code = np.where(seg >= 8, 0x7F, code)
    return (code ^ mask).astype(np.uint8)


def linear_to_alaw(pcm: np.ndarray) -> np.ndarray:
    """16-bit linear samples (int array) -> G.711 A-law bytes (uint8), even bits inverted (XOR 0x55)."""
    x = pcm >> 3  # 13-bit
    mask = np.where(x >= 0, 0xD5, 0x55)
    x = np.where(x >= 0, x, -x - 1)
    seg = _segment(x, _ALAW_ENDS)
    low = np.where(seg < 2, x >> 1, x >> np.maximum(seg, 1)) & 0xF
    code = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | low)
    return (code ^ mask).astype(np.uint8)


class G711Encoder(AudioEncoder):
    """Headerless 8-bit companded telephony audio (one byte per sample, so it streams sample-exact)."""

    def __init__(self, sample_rate: int, law: str):
        super().__init__(sample_rate)
        self._encode = linear_to_ulaw if law == "ulaw" else linear_to_alaw

    def encode(self, audio: np.ndarray) -> bytes:
        return self._encode(_pcm16_values(audio)).tobytes()

    def finish(self) -> bytes:
        return b""


def make_encoder(fmt: str, sample_rate: int, *, num_samples: int | None = None,
                 whole: bool = False) -> AudioEncoder:
    """An encoder for one response. `num_samples` (known length) only matters for WAV's header; `whole`
    (nothing is sent before `finish()`) lets the PyAV containers complete their headers."""
    if fmt == "pcm":
        return PCMEncoder(sample_rate)
    if fmt in ("ulaw", "alaw"):
        return G711Encoder(sample_rate, fmt)
    if fmt == "wav":
        return WavEncoder(sample_rate, num_samples)
    if fmt in _AV_SPECS:
        return PyAVEncoder(fmt, sample_rate, whole=whole)
    raise ValueError(f"unknown audio format {fmt!r}")
