"""The embedded model's codec ("demo-mel"): k-means-quantised log-mel at 50 codes/s, 16 kHz.

Encode: log-mel frames (engine.codec.demo.features) -> nearest codebook centroid. Decode: codes -> log-mel
(engine.codec.demo.decoder) -> block-wise Griffin-Lim (engine.codec.demo.griffinlim). `decode` is the
streaming decoder fed the whole sequence, so chunked and whole decoding give the same audio.

Codec directory: `codec.json` (settings), `codebook.safetensors` (`codebook` [K, 80]) and optionally
`decoder.safetensors` (the conv decoder's weights).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from pcgtts.engine.codec.base import Codec, StreamingDecoder
from pcgtts.engine.codec.demo.decoder import CentroidLookup, CodeToMel
from pcgtts.engine.codec.demo.features import LOG_FLOOR, MelSpec
from pcgtts.engine.codec.demo.griffinlim import BlockGLConfig, BlockGriffinLim, synthesize_blocks
from safetensors.torch import load_file


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

    def set_first_block_frames(self, frames: int) -> None:
        self.gl = replace(self.gl, first_block=frames)

    def right_context(self, block: int) -> int:
        """Codes after block `block`'s look-ahead the conv decoder reads for it (fewer for block 0 when
        `gl.first_context` says so: earlier first audio)."""
        ctx = self.decoder.context
        if block == 0 and self.gl.first_context is not None:
            return min(ctx, self.gl.first_context)
        return ctx

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

    def decode_streams(self, work: list[tuple[StreamingDecoder, np.ndarray | None]]) -> list[np.ndarray]:
        """Feeds each stream its codes (None = flush) and decodes every block that became ready, in
        rounds of at most one block per stream, each round one batched conv pass and one batched
        Griffin-Lim per block size."""
        for stream, codes in work:
            assert isinstance(stream, DemoStreamingDecoder) and stream.codec is self
            if codes is not None:
                stream.codes.extend(int(c) for c in np.asarray(codes).reshape(-1))
        parts: list[list[np.ndarray]] = [[np.zeros(0, np.float32)] for _ in work]
        while True:
            due = [i for i, (stream, codes) in enumerate(work) if stream.block_due(flushing=codes is None)]
            if not due:
                return [np.concatenate(p) for p in parts]
            streams = [work[i][0] for i in due]
            segs = self._block_mels(streams)
            audio = synthesize_blocks([s.synth for s in streams], segs, [len(s.codes) for s in streams])
            for i, a in zip(due, audio, strict=True):
                parts[i].append(a)

    def _block_mels(self, streams: list[DemoStreamingDecoder]) -> list[torch.Tensor]:
        """Each stream's next block span of decoded log-mel [hi - lo, n_mels]; the conv decoder sees its
        `context` frames either side. One window per decoder call: its convolutions round a window
        differently in batches of different sizes (on the build machines the 1x1 ones for fewer than 16
        windows, the wider ones for one), and a stream's audio must not depend on which others share the
        codec's call; the Griffin-Lim after it stays batched."""
        mels = []
        for codes, skip, n in map(self.block_window, streams):
            with torch.no_grad():
                mels.append(self.decoder(torch.as_tensor(codes)[None])[0, skip: skip + n])
        return mels

    def block_window(self, stream: DemoStreamingDecoder) -> tuple[np.ndarray, int, int]:
        """(the codes the conv decoder reads for the stream's next block [window], offset of the block's
        span in them, its frames): the span with `context` frames either side, as far as they exist."""
        total, synth = len(stream.codes), stream.synth
        lo, hi = synth.span(total)
        clo, chi = max(0, lo - self.decoder.context), min(total, hi + self.right_context(synth.next_block))
        return np.asarray(stream.codes[clo:chi], dtype=np.int64), lo - clo, hi - lo

    def synthesize(self, log_mel: torch.Tensor) -> np.ndarray:
        """Griffin-Lim of any log-mel [frames, n_mels] (e.g. unquantised features) with the same blocks."""
        return BlockGriffinLim(self.spec, self.gl).synthesize_all(log_mel)

    def streaming_decoder(self) -> StreamingDecoder:
        return DemoStreamingDecoder(self)


class DemoStreamingDecoder(StreamingDecoder):
    """Decodes a block once its look-ahead (and the conv decoder's context) has arrived; the work runs
    in `DemoMelCodec.decode_streams`, alone or batched with other streams."""

    def __init__(self, codec: DemoMelCodec):
        self.codec = codec
        self.codes: list[int] = []
        self.synth = BlockGriffinLim(codec.spec, codec.gl)

    def block_due(self, flushing: bool) -> bool:
        """Whether the next block can be decoded now (flushing: the sequence is complete)."""
        if flushing:
            return not self.synth.done(len(self.codes))
        return self.codes_until_audio() == 0

    def codes_until_audio(self) -> int:
        needed = self.synth.codes_needed(self.codec.right_context(self.synth.next_block))
        return max(0, needed - len(self.codes))

    def push(self, codes: np.ndarray) -> np.ndarray:
        return self.codec.decode_streams([(self, codes)])[0]

    def checkpoint(self) -> Callable[[], None]:
        """Cheap: codes are only appended, and each block replaces the synthesiser's state (no in-place
        change)."""
        n, synth = len(self.codes), dict(vars(self.synth))

        def restore() -> None:
            del self.codes[n:]
            vars(self.synth).clear()
            vars(self.synth).update(synth)

        return restore

    def flush(self) -> np.ndarray:
        return self.codec.decode_streams([(self, None)])[0]
