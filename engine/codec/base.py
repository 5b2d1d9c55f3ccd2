"""The codec contract: waveform <-> discrete speech codes, with a streaming decoder.

A codec turns mono float32 audio at `sample_rate` into integer codes at `frame_rate` codes per second
(one codebook), and back. Speech families map codes <-> LM token ids; the server only sees audio.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import numpy as np


class EncoderUnavailable(RuntimeError):
    """This codec was loaded for decoding only (e.g. X-codec2 without its semantic model): it cannot turn
    audio into codes. The message says what is missing and how to provide it."""


class StreamingDecoder(ABC):
    """Decodes a growing code sequence chunk by chunk.

    `push` takes the codes accepted since the last call and returns the audio that is final so far
    (it may hold back a few frames of look-ahead so that chunk joins are seamless); `flush` returns the
    rest. Concatenating all returned chunks equals `Codec.decode` of the whole sequence (up to float
    rounding), whatever the chunking.
    """

    @abstractmethod
    def push(self, codes: np.ndarray) -> np.ndarray:  # codes: int [n] -> float32 [samples]
        ...

    @abstractmethod
    def flush(self) -> np.ndarray:  # float32 [samples]
        ...

    def codes_until_audio(self) -> int | None:
        """More codes this decoder needs before `push` returns audio again (0: it has them), or None
        where it cannot say. The service paces a stream's first audio with it (tts/first_audio.py)."""
        return None

    def checkpoint(self) -> Callable[[], None]:
        """The decoder's state now -> a function that puts it back (after a batched decode that failed,
        so each stream can be retried alone). Default: a deep copy that shares every codec the decoder
        holds, directly or through a bound method (`self.decode = codec.decode`): a codec's weights are
        never copied."""
        owners = (getattr(v, "__self__", v) for v in vars(self).values())
        saved = copy.deepcopy(self, {id(o): o for o in owners if isinstance(o, Codec)})

        def restore() -> None:
            vars(self).clear()
            vars(self).update(vars(saved))

        return restore


class Codec(ABC):
    """Everything the TTS service asks of a codec; implementations: `demo/` and `xcodec2/`."""

    sample_rate: int  # Hz of the audio `decode` returns and `encode` expects
    frame_rate: int  # codes per second
    codebook_size: int
    # Keyword options of `from_dir` beyond the path (X-codec2: "device", "semantic_model"); the bundle
    # passes only these.
    load_options: tuple[str, ...] = ()

    @classmethod
    @abstractmethod
    def from_dir(cls, path: str | Path | None) -> Codec:
        """The codec stored at `path` (a bundle's codec directory)."""

    @abstractmethod
    def encode(self, audio: np.ndarray) -> np.ndarray:
        """audio: float32 [samples] at `sample_rate` -> int64 codes [frames]."""

    @abstractmethod
    def decode(self, codes: np.ndarray) -> np.ndarray:
        """int codes [frames] -> float32 audio [frames * sample_rate / frame_rate]."""

    @abstractmethod
    def streaming_decoder(self) -> StreamingDecoder:
        """A fresh per-utterance streaming decoder."""

    def decode_streams(self, work: list[tuple[StreamingDecoder, np.ndarray | None]]) -> list[np.ndarray]:
        """One step of several utterances' streaming decoders (each from this codec, each at most once):
        stream i gets codes work[i][1] (None = flush) and returns its final audio so far, as its own
        push/flush would. Codecs that can batch across streams override this."""
        return [stream.flush() if codes is None else stream.push(codes) for stream, codes in work]

    def set_first_block_frames(self, frames: int) -> None:
        """Frames of the first block a streaming decoder emits (smaller: earlier first audio). Only codecs
        that decode in blocks have such a schedule; the others refuse."""
        raise ValueError(f"the {type(self).__name__} codec has no block schedule to set")
