"""X-codec2 (Llasa's codec: 16 kHz, 50 codes/s, one 65,536-entry FSQ codebook) behind the Codec contract.

Used for real Llasa deployments. It needs the optional `xcodec2` package (`make install-xcodec2`) and local
directories only (see `loading`): the codec checkpoint, and for encoding voice prompts the semantic model
w2v-bert-2.0 (`semantic_model=` / PCGTTS_SEMANTIC_MODEL, else the Hugging Face cache, offline). Without the
semantic model the codec decodes (preset voices whose codes are stored) and `encode` raises
EncoderUnavailable. Its decoder is non-causal (a Transformer over the whole code sequence), so the
streaming decoder re-decodes a window with context on both sides of each chunk: chunk joins are close to,
not bit-identical with, one whole-sequence decode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from pcgtts.engine.codec.base import Codec, EncoderUnavailable, StreamingDecoder


class XCodec2Codec(Codec):
    sample_rate = 16000
    frame_rate = 50
    codebook_size = 65536
    load_options = ("device", "semantic_model")

    def __init__(self, model, device: str | torch.device = "cpu", encoder_missing: str = ""):
        """model: xcodec2's XCodec2Model; encoder_missing: why it cannot encode ("" when it can)."""
        self.model = model
        self.device = torch.device(device)
        self.encoder_missing = encoder_missing

    @classmethod
    def from_dir(cls, path: str | Path | None, device: str | None = None,
                 semantic_model: str | Path | None = None) -> XCodec2Codec:
        from pcgtts.engine.codec.xcodec2.loading import find_semantic_dir, load_model
        from pcgtts.engine.codec.xcodec2.stand_ins import xcodec2_imported

        if path is None or not Path(path).is_dir():
            raise FileNotFoundError(f"X-codec2 needs a local codec directory, --codec DIR (got {path!r}); "
                                    "download HKUSTAudio/xcodec2 beforehand")
        xcodec2_imported()  # ImportError naming `make install-xcodec2` when the extra is missing
        semantic_dir, reason = find_semantic_dir(semantic_model)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = load_model(Path(path), semantic_dir, reason).to(device)
        return cls(model, device, reason)

    @property
    def can_encode(self) -> bool:
        return not self.encoder_missing

    @property
    def hop(self) -> int:
        return self.sample_rate // self.frame_rate

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> np.ndarray:
        if self.encoder_missing:
            raise EncoderUnavailable(self.encoder_missing)
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

    def codes_until_audio(self) -> int:
        return max(0, self.emitted + self.chunk + self.lookahead - len(self.codes))

    def flush(self) -> np.ndarray:
        if self.emitted >= len(self.codes):
            return np.zeros(0, np.float32)
        return self._emit(len(self.codes), len(self.codes))
