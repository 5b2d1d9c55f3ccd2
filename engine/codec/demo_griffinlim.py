"""Block-wise Griffin-Lim: log-mel frames -> audio in fixed blocks, so streaming and whole decode agree.

Block k turns mel frames [k B, (k + 1) B) into final audio, using `left` frames of context before it and
`right` frames of look-ahead after it. The phase of the context frames is carried over from block k - 1's
estimate, and the audio around each block boundary is cross-faded between the two blocks' signals, so
joins are smooth. Because the blocks sit at fixed positions (not where a chunk happened to end), decoding
a sequence in any chunking gives the same samples.

Synthesis runs at half the analysis hop (log-mel frames are interpolated to 100 frames/s) for a denser
overlap, which Griffin-Lim needs for clean phase.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.codec.demo_features import MelSpec

UPSAMPLE = 2  # synthesis frames per mel frame


@dataclass(frozen=True)
class BlockGLConfig:
    block: int = 32  # mel frames of final audio per block
    left: int = 6  # context frames before the block (phase carried from the previous block)
    right: int = 6  # look-ahead frames after the block
    iterations: int = 16
    momentum: float = 0.99
    crossfade: int = 320  # samples cross-faded at each block boundary (centred on it)


class BlockGriffinLim:
    """Stateful per-utterance block synthesiser; feed it blocks in order."""

    def __init__(self, spec: MelSpec, cfg: BlockGLConfig):
        self.spec, self.cfg = spec, cfg
        self.hop = spec.hop // UPSAMPLE
        self.prev_phase: torch.Tensor | None = None  # [F, frames] complex unit phases of the last segment
        self.prev_start = 0  # first synthesis frame of the last segment
        self.prev_tail: np.ndarray | None = None  # last block's audio after its boundary, for the cross-fade
        self.next_block = 0

    def _initial_phase(self, start: int, frames: int) -> torch.Tensor:
        """Fixed pseudo-random phases by absolute frame (chunking-independent), then carried ones."""
        f = self.spec.n_fft // 2 + 1
        gen = torch.Generator().manual_seed(1000003 * start + frames)
        phase = torch.polar(torch.ones(f, frames), 2 * torch.pi * torch.rand(f, frames, generator=gen))
        if self.prev_phase is not None:
            lo = start - self.prev_start  # overlap of this segment with the previous one
            hi = min(self.prev_phase.shape[1], lo + frames)
            if 0 <= lo < hi:
                phase[:, : hi - lo] = self.prev_phase[:, lo:hi]
        return phase

    def _griffin_lim(self, mag: torch.Tensor, phase: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
        # mag: [F, frames] linear magnitudes; phase: [F, frames] complex unit
        n_fft, hop, window = self.spec.n_fft, self.hop, self.spec.window
        length = mag.shape[1] * hop
        prev = torch.zeros_like(phase)
        coef = self.cfg.momentum / (1 + self.cfg.momentum)
        for _ in range(self.cfg.iterations):
            audio = torch.istft(mag * phase, n_fft, hop, window=window, center=True, length=length)
            rebuilt = torch.stft(audio, n_fft, hop, window=window, center=True, return_complex=True)[:, :-1]
            phase = rebuilt - coef * prev
            prev = rebuilt
            phase = phase / (phase.abs() + 1e-8)
        audio = torch.istft(mag * phase, n_fft, hop, window=window, center=True, length=length)
        return audio.numpy(), phase

    def span(self, total: int) -> tuple[int, int]:
        """Mel frames [lo, hi) the next block reads, given `total` frames so far."""
        k, cfg = self.next_block, self.cfg
        return max(0, k * cfg.block - cfg.left), min(total, (k + 1) * cfg.block + cfg.right)

    def ready(self, available: int, context: int = 0) -> bool:
        """Whether the next block's look-ahead (plus `context` frames more) has arrived."""
        return (self.next_block + 1) * self.cfg.block + self.cfg.right + context <= available

    def done(self, total: int) -> bool:
        return self.next_block * self.cfg.block >= total

    def synthesize_all(self, log_mel: torch.Tensor) -> np.ndarray:
        """A whole log-mel [frames, n_mels] -> audio [frames * hop] (a fresh synthesiser's blocks)."""
        parts = [np.zeros(0, np.float32)]
        while not self.done(len(log_mel)):
            lo, hi = self.span(len(log_mel))
            parts.append(self.synthesize_block(log_mel[lo:hi], len(log_mel)))
        return np.concatenate(parts)

    def synthesize_block(self, seg: torch.Tensor, total: int) -> np.ndarray:
        """The next block from seg = log-mel frames `self.span(total)` [n, n_mels]; `total` frames exist
        (the final count at the end of the sequence, else any count for which `ready` holds). Returns the
        block's final audio."""
        cfg, k = self.cfg, self.next_block
        lo, hi = self.span(total)
        assert seg.shape[0] == hi - lo
        # Interpolate to the synthesis rate in the log domain: [UPSAMPLE * n, n_mels].
        fine = torch.nn.functional.interpolate(seg.T[None], scale_factor=UPSAMPLE, mode="linear",
                                               align_corners=False)[0].T
        mag = self.spec.linear_magnitude(fine)  # [F, UPSAMPLE * n]
        start = UPSAMPLE * lo
        audio, phase = self._griffin_lim(mag, self._initial_phase(start, mag.shape[1]))
        self.prev_phase, self.prev_start = phase, start
        # Final samples of this block: [boundary_k - c/2, boundary_{k+1} - c/2), cross-faded at the start.
        offset = lo * self.spec.hop  # absolute sample of audio[0]
        half = cfg.crossfade // 2
        b0 = k * cfg.block * self.spec.hop
        b1 = min(total, (k + 1) * cfg.block) * self.spec.hop
        end_final = b1 - half if (k + 1) * cfg.block < total else b1
        begin = max(0, b0 - half)
        out = audio[begin - offset: end_final - offset].copy()
        if self.prev_tail is not None and k > 0:
            n = min(len(self.prev_tail), len(out))
            ramp = (np.arange(n, dtype=np.float32) + 0.5) / n
            out[:n] = out[:n] * ramp + self.prev_tail[:n] * (1 - ramp)
        self.prev_tail = audio[end_final - offset: end_final - offset + cfg.crossfade].copy()
        self.next_block += 1
        return out.astype(np.float32)
