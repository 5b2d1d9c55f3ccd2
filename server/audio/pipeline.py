"""From model audio to response bytes: tempo (speed) -> resample to the output rate -> encode.

One `OutputPipeline` per response. Chunks go in at the model's sample rate as they are decoded;
bytes come out as soon as the encoder has them. soxr's streaming resampler keeps its filter state
across chunks, so chunk joins get no resampling artefacts.
"""

from __future__ import annotations

import numpy as np
import soxr
from pcgtts.server.audio.encoders import make_encoder, wav_header
from pcgtts.server.audio.formats import output_rate
from pcgtts.server.audio.tempo import TempoStream


class Resampler:
    """Streaming high-quality resampling; a pass-through when the rates agree."""

    def __init__(self, in_rate: int, out_rate: int):
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ") \
            if in_rate != out_rate else None

    def process(self, audio: np.ndarray, last: bool = False) -> np.ndarray:
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        if self._stream is None:
            return audio
        return self._stream.resample_chunk(audio, last=last)


class OutputPipeline:
    def __init__(self, fmt: str, in_rate: int, *, speed: float = 1.0, out_rate: int | None = None,
                 num_samples: int | None = None, whole: bool = False):
        """out_rate: default the format's own (`output_rate`). num_samples: the exact output length when
        known in advance (only a whole-body WAV uses it). whole: bytes are only sent after `finish()`."""
        self.format = fmt
        self.in_rate, self.speed = in_rate, speed
        self.out_rate = out_rate = out_rate or output_rate(fmt)
        self._tempo = TempoStream(in_rate, speed) if abs(speed - 1.0) > 1e-6 else None
        self._resampler = Resampler(in_rate, out_rate)
        self._encoder = make_encoder(fmt, out_rate, num_samples=num_samples, whole=whole)
        self.samples_out = 0  # at out_rate, after tempo

    def _emit(self, audio: np.ndarray) -> bytes:
        self.samples_out += audio.size
        return self._encoder.encode(audio) if audio.size else b""

    def process(self, audio: np.ndarray) -> bytes:
        """float32 [n] at the model rate -> bytes to send now (possibly empty)."""
        if self._tempo is not None:
            audio = self._tempo.process(audio)
        return self._emit(self._resampler.process(audio))

    def finish(self) -> bytes:
        tail = self._tempo.finish() if self._tempo is not None else np.zeros(0, np.float32)
        data = self._emit(self._resampler.process(tail, last=True))
        return data + self._encoder.finish()

    @property
    def audio_seconds(self) -> float:
        return self.samples_out / self.out_rate

    def position(self, sample: int) -> int:
        """Where the model's audio sample `sample` lies in the output (its rate, after tempo)."""
        return round(sample * self.out_rate / self.in_rate / self.speed)


def encode_whole(fmt: str, audio: np.ndarray, in_rate: int, *, speed: float = 1.0,
                 out_rate: int | None = None) -> bytes:
    """One-shot encoding of a whole utterance (non-streamed responses): exact WAV sizes, complete FLAC
    STREAMINFO (total samples, MD5)."""
    out_rate = out_rate or output_rate(fmt)
    if fmt == "wav":
        # Run tempo + resampling first to learn the exact length for the header.
        pcm = OutputPipeline("pcm", in_rate, speed=speed, out_rate=out_rate)
        body = pcm.process(audio) + pcm.finish()
        return wav_header(out_rate, len(body) // 2) + body
    pipe = OutputPipeline(fmt, in_rate, speed=speed, out_rate=out_rate, whole=True)
    return pipe.process(audio) + pipe.finish()
