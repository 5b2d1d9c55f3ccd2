"""The embedded model's codec ("demo-mel"): k-means-quantised log-mel at 50 codes/s, 16 kHz.

Encode: log-mel frames (engine.codec.demo_features) -> nearest codebook centroid. Decode: codes -> log-mel
(engine.codec.demo_decoder) -> block-wise Griffin-Lim (engine.codec.demo_griffinlim). `decode` is the
streaming decoder fed the whole sequence, so chunked and whole decoding give the same audio.

Codec directory: `codec.json` (settings), `codebook.safetensors` (`codebook` [K, 80]) and optionally
`decoder.safetensors` (the conv decoder's weights).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from engine.codec.base import Codec, StreamingDecoder
from engine.codec.demo_decoder import CentroidLookup, CodeToMel
from engine.codec.demo_features import LOG_FLOOR, MelSpec
from engine.codec.demo_griffinlim import BlockGLConfig, BlockGriffinLim


class DemoMelCodec(Codec):
    frame_rate = 50

    def __init__(self, codebook: torch.Tensor, decoder: torch.nn.Module | None = None,
                 gl: BlockGLConfig = BlockGLConfig()):
        self.spec = MelSpec()
        self.sample_rate = self.spec.sample_rate
        self.codebook = codebook.float()  # [K, n_mels]
        self.codebook_size = codebook.shape[0]
        self.decoder = (decoder or CentroidLookup(self.codebook)).eval()
        self.gl = gl

    @classmethod
    def from_dir(cls, path: str | Path) -> DemoMelCodec:
        path = Path(path)
        spec = json.loads((path / "codec.json").read_text())
        codebook = load_file(path / "codebook.safetensors")["codebook"].float()
        decoder = None
        if (path / "decoder.safetensors").exists():
            decoder = CodeToMel(codebook, **spec.get("decoder", {}))
            state = {k: v.float() for k, v in load_file(path / "decoder.safetensors").items()}
            decoder.load_state_dict(state | {"codebook": codebook})
        return cls(codebook, decoder, BlockGLConfig(**spec.get("griffin_lim", {})))

    def save(self, path: str | Path, decoder_kwargs: dict | None = None) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file({"codebook": self.codebook.contiguous()}, path / "codebook.safetensors")
        spec = {"type": "demo-mel", "sample_rate": self.sample_rate, "frame_rate": self.frame_rate,
                "codebook_size": self.codebook_size, "griffin_lim": asdict(self.gl)}
        if isinstance(self.decoder, CodeToMel):
            spec["decoder"] = decoder_kwargs or {}
            state = {k: v.half().contiguous() for k, v in self.decoder.state_dict().items()
                     if k != "codebook"}
            save_file(state, path / "decoder.safetensors")
        (path / "codec.json").write_text(json.dumps(spec, indent=1))

    def features(self, audio: np.ndarray) -> torch.Tensor:
        """audio float32 [samples] at 16 kHz -> floored log-mel [frames, n_mels]."""
        return self.spec.log_mel(audio).clamp(min=float(np.log(LOG_FLOOR)))

    def quantize(self, log_mel: torch.Tensor) -> np.ndarray:
        """log-mel [frames, n_mels] -> nearest-centroid codes int64 [frames]."""
        c = self.codebook
        d = (c * c).sum(1)[None] - 2 * log_mel @ c.T  # [frames, K] squared distance up to |x|^2
        return d.argmin(1).numpy().astype(np.int64)

    def encode(self, audio: np.ndarray) -> np.ndarray:
        return self.quantize(self.features(audio))

    def decode(self, codes: np.ndarray) -> np.ndarray:
        stream = self.streaming_decoder()
        return np.concatenate([stream.push(np.asarray(codes)), stream.flush()])

    def synthesize(self, log_mel: torch.Tensor) -> np.ndarray:
        """Griffin-Lim of any log-mel [frames, n_mels] (e.g. unquantised features) with the same blocks."""
        return BlockGriffinLim(self.spec, self.gl).synthesize_all(log_mel)

    def decode_mel(self, codes: np.ndarray) -> torch.Tensor:
        """codes int [T] -> decoded log-mel [T, n_mels] (whole sequence at once)."""
        with torch.no_grad():
            return self.decoder(torch.as_tensor(np.asarray(codes, dtype=np.int64))[None])[0]

    def streaming_decoder(self) -> StreamingDecoder:
        return DemoStreamingDecoder(self)


class DemoStreamingDecoder(StreamingDecoder):
    """Decodes a block once its look-ahead (and the conv decoder's context) has arrived."""

    def __init__(self, codec: DemoMelCodec):
        self.codec = codec
        self.codes: list[int] = []
        self.synth = BlockGriffinLim(codec.spec, codec.gl)

    def _block(self, total: int) -> np.ndarray:
        ctx = self.codec.decoder.context
        lo, hi = self.synth.span(total)
        clo, chi = max(0, lo - ctx), min(total, hi + ctx)  # the conv decoder's context on both sides
        mel = self.codec.decode_mel(np.array(self.codes[clo:chi]))  # [chi - clo, n_mels]
        return self.synth.synthesize_block(mel[lo - clo: hi - clo], total)

    def push(self, codes: np.ndarray) -> np.ndarray:
        self.codes.extend(int(c) for c in np.asarray(codes).reshape(-1))
        out = [np.zeros(0, np.float32)]
        while self.synth.ready(len(self.codes), self.codec.decoder.context):
            out.append(self._block(len(self.codes)))
        return np.concatenate(out)

    def flush(self) -> np.ndarray:
        out = [np.zeros(0, np.float32)]
        while not self.synth.done(len(self.codes)):
            out.append(self._block(len(self.codes)))
        return np.concatenate(out)
