"""X-codec2 (Llasa's codec: 16 kHz, 50 codes/s, one 65,536-entry FSQ codebook) behind the Codec contract.

Used only for real Llasa deployments: it needs the optional `xcodec2` package (pip install xcodec2) and a
local codec directory (`XCodec2Model.from_pretrained(dir)`); both are imported and loaded lazily, and
nothing is downloaded. Its decoder is non-causal (a Transformer over the whole code sequence), so the
streaming decoder re-decodes a window with context on both sides of each chunk: chunk joins are close to,
not bit-identical with, one whole-sequence decode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.codec.base import Codec, StreamingDecoder


class XCodec2Codec(Codec):
    sample_rate = 16000
    frame_rate = 50
    codebook_size = 65536

    def __init__(self, model, device: str | torch.device = "cpu"):
        self.model = model
        self.device = torch.device(device)

    @classmethod
    def from_dir(cls, path: str | Path | None, device: str | None = None) -> XCodec2Codec:
        if path is None or not Path(path).is_dir():
            raise FileNotFoundError(f"X-codec2 needs a local codec directory (got {path!r})")
        try:
            from xcodec2.modeling_xcodec2 import XCodec2Model
        except ImportError as exc:
            raise ImportError("the X-codec2 codec needs the optional `xcodec2` package "
                              "(pip install xcodec2)") from exc
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = XCodec2Model.from_pretrained(str(path)).eval().to(device)
        return cls(model, device)

    @property
    def hop(self) -> int:
        return self.sample_rate // self.frame_rate

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> np.ndarray:
        wav = torch.as_tensor(np.asarray(audio, dtype=np.float32), device=self.device)[None]  # [1, samples]
        codes = self.model.encode_code(input_waveform=wav)  # [1, 1, frames]
        return codes[0, 0].long().cpu().numpy()

    @torch.inference_mode()
    def decode(self, codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(codes, dtype=np.int64).reshape(-1)
        if codes.size == 0:
            return np.zeros(0, np.float32)
        wav = self.model.decode_code(torch.as_tensor(codes, device=self.device)[None, None])  # [1, 1, n]
        return wav.reshape(-1)[: codes.size * self.hop].float().cpu().numpy()

    def streaming_decoder(self) -> StreamingDecoder:
        return WindowedStreamingDecoder(self.decode, self.hop)


class WindowedStreamingDecoder(StreamingDecoder):
    """Emits `chunk` frames at a time once `lookahead` later frames exist, decoding each chunk inside a
    window of `context` earlier and `lookahead` later frames. Exact for any decoder whose receptive field
    fits the window; an approximation for whole-sequence decoders."""

    def __init__(self, decode, hop: int, chunk: int = 25, context: int = 50, lookahead: int = 25):
        self.decode, self.hop = decode, hop
        self.chunk, self.context, self.lookahead = chunk, context, lookahead
        self.codes: list[int] = []
        self.emitted = 0  # frames whose audio has been returned

    def _emit(self, end: int, total: int) -> np.ndarray:
        """Audio of frames [emitted, end), decoded with the window up to `total`."""
        lo = max(0, self.emitted - self.context)
        audio = self.decode(np.asarray(self.codes[lo:total], dtype=np.int64))
        out = audio[(self.emitted - lo) * self.hop:(end - lo) * self.hop]
        self.emitted = end
        return out.astype(np.float32, copy=False)

    def push(self, codes: np.ndarray) -> np.ndarray:
        self.codes.extend(int(c) for c in np.asarray(codes).reshape(-1))
        out = []
        while len(self.codes) - self.emitted >= self.chunk + self.lookahead:
            end = self.emitted + self.chunk
            out.append(self._emit(end, end + self.lookahead))
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def flush(self) -> np.ndarray:
        if self.emitted >= len(self.codes):
            return np.zeros(0, np.float32)
        return self._emit(len(self.codes), len(self.codes))
