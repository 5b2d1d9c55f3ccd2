"""Block-wise Griffin-Lim: log-mel frames -> audio in fixed blocks, so streaming and whole decode agree.

Block k turns mel frames [start_k, end_k) into final audio, using `left` frames of context before it and
`right` frames of look-ahead after it. The phase of the context frames is carried over from block k - 1's
estimate, and the audio around each block boundary is cross-faded between the two blocks' signals, so
joins are smooth. Because the blocks sit at fixed positions (not where a chunk happened to end), decoding
a sequence in any chunking gives the same samples.

The block sizes ramp up: the first block is `first_block` frames and each next one doubles up to `block`
(e.g. 8, 16, 32, 32, ... frames), so the first audio needs few codes (time to first audio) while later
blocks are long enough to amortise their context frames.

Blocks of several utterances with the same frame count run as one batched Griffin-Lim
(`synthesize_blocks`); one utterance's block is the batch of one, and every op computes a block's numbers
alike in a batch of any size (the STFTs and the phase normalisation run block by block: `griffin_lim`), so
the samples do not depend on batching, bit for bit.

Synthesis runs at half the analysis hop (log-mel frames are interpolated to 100 frames/s) for a denser
overlap, which Griffin-Lim needs for clean phase.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from pcgtts.engine.codec.demo.features import MelSpec

UPSAMPLE = 2  # synthesis frames per mel frame

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class BlockGLConfig:
    # mel frames of final audio per block once the ramp is over. 16 rather than 32 on the embedded model:
    # earlier and steadier audio when generation is barely faster than real time (`pcgtts bench load`), at
    # a slightly higher codec round-trip WER (`pcgtts recipe demo eval`).
    block: int = 16
    left: int = 6  # context frames before the block (phase carried from the previous block)
    right: int = 6  # look-ahead frames after the block
    iterations: int = 8  # Griffin-Lim iterations per block: more cost time and gave no better round-trip WER
    momentum: float = 0.99
    crossfade: int = 320  # samples cross-faded at each block boundary (centred on it)
    first_block: int = 8  # frames of the first block; sizes double from here up to `block`
    # Frames of the conv decoder's right context block 0 waits for (None: all of it). Fewer means the
    # first audio needs fewer codes; the codes block 0 reads are fixed either way (chunking-independent).
    first_context: int | None = None

    def __post_init__(self) -> None:
        if self.first_block < 1 or self.block < 1:
            raise ValueError(f"block sizes must be >= 1 frame (first_block={self.first_block})")

    def bounds(self, k: int) -> tuple[int, int]:
        """Mel frames [start, end) of block k's final audio."""
        start, size = 0, min(self.first_block, self.block)
        while k > 0 and size < self.block:
            start, size, k = start + size, min(2 * size, self.block), k - 1
        return start + k * size, start + (k + 1) * size

    def boundaries(self, total: int) -> list[int]:
        """The block boundaries (mel frames) strictly inside a sequence of `total` frames."""
        out, k = [], 1
        while (b := self.bounds(k)[0]) < total:
            out.append(b)
            k += 1
        return out


def batched_by(key: Callable[[T], object], items: Sequence[T], run: Callable[[list[T]], list[R]]) -> list[R]:
    """run() on each group of items with equal key (one call per group), results in the items' order."""
    groups: dict[object, list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        groups[key(item)].append(i)
    out: list[R | None] = [None] * len(items)
    for idx in groups.values():
        for i, result in zip(idx, run([items[i] for i in idx]), strict=True):
            out[i] = result
    return out  # type: ignore[return-value]


def griffin_lim(spec: MelSpec, cfg: BlockGLConfig, mag: torch.Tensor, phase: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fast Griffin-Lim (momentum) on a batch. mag: [B, F, n] linear magnitudes; phase: [B, F, n] complex
    unit start phases -> (audio [B, n * hop / UPSAMPLE], final phases [B, F, n]).

    Each block iterates on its own, so that a stream's audio does not depend on which others the codec
    decodes with it: batched FFTs pick other kernels than a single one (on the Intel build machine the
    inverse differs in the last bits), and `torch.sgn` rounds the last few elements of its input by another
    code path. Its spectra stay apart from the other blocks' between iterations (stacking them after every
    op and splitting them again was a tenth of the codec's time); the elementwise steps are single ops
    either way (a real or scalar factor times a complex number, a difference), the same numbers."""
    n_fft, hop, window = spec.n_fft, spec.hop // UPSAMPLE, spec.window
    length = mag.shape[-1] * hop
    # reflect padding needs more than n_fft / 2 samples; a block of a frame or two (a 2-token utterance)
    # is zero-padded instead of failing
    pad_mode = "reflect" if length > n_fft // 2 else "constant"
    coef = cfg.momentum / (1 + cfg.momentum)
    envelope = window_envelope(window, hop, mag.shape[-1])  # looked up once for the batch's every istft

    def istft(spectra: torch.Tensor) -> torch.Tensor:  # [F, n] -> [length]
        return inverse_stft(spectra, window, hop, length, envelope)

    def stft(audio: torch.Tensor) -> torch.Tensor:  # [length] -> [F, n], contiguous: complex arithmetic
        # over a strided view rounds otherwise than over contiguous memory (measured), and a block's numbers
        # must not depend on how they are laid out
        return torch.stft(audio, n_fft, hop, window=window, center=True, pad_mode=pad_mode,
                          return_complex=True)[..., :-1].contiguous()

    mags, phases = mag.unbind(0), list(phase.unbind(0))
    prevs = [torch.zeros_like(p) for p in phases]
    for _ in range(cfg.iterations):
        for i, block_mag in enumerate(mags):
            rebuilt = stft(istft(block_mag * phases[i]))
            phases[i] = torch.sgn(rebuilt - coef * prevs[i])
            prevs[i] = rebuilt
    return torch.stack([istft(m * p) for m, p in zip(mags, phases, strict=True)]), torch.stack(phases)


def inverse_stft(spectra: torch.Tensor, window: torch.Tensor, hop: int, length: int,
                 envelope: torch.Tensor) -> torch.Tensor:
    """torch.istft(spectra, n_fft, hop, window=window, center=True, length=length) for one spectrogram
    [n_fft // 2 + 1, n] -> [length], the same bits: the same inverse FFT, window product and overlap-add
    (aten's unfold_backward), but the window's own overlap-add, which it divides by, is given
    (`window_envelope(window, hop, n)`, kept per shape) instead of computed in every call, where it was half
    of the codec's overlap-add time."""
    n_fft, frames = window.shape[0], spectra.shape[-1]
    total = n_fft + hop * (frames - 1)
    y = torch.fft.irfft(spectra.T[None], n_fft, dim=-1) * window  # [1, n, n_fft], as torch.istft lays it
    y = torch.ops.aten.unfold_backward(y, [1, total], 1, n_fft, hop)[0]  # [total]
    start = n_fft // 2  # center=True
    end = min(start + length, total)
    out = y[start:end] / envelope[start:end]
    return torch.nn.functional.pad(out, (0, length - out.shape[0]))  # zeros past the signal, as istft


_ENVELOPES: dict[tuple, torch.Tensor] = {}


def window_envelope(window: torch.Tensor, hop: int, frames: int) -> torch.Tensor:
    """The overlap-added squared window over `frames` frames [n_fft + hop * (frames - 1)], computed as
    torch.istft does, kept per (window values, hop, frames): the codec's blocks come in a few sizes."""
    key = (window.shape[0], hop, frames, hash(window.numpy().tobytes()))
    if key not in _ENVELOPES:
        n_fft = window.shape[0]
        squared = window.pow(2).expand(1, frames, n_fft)
        envelope = torch.ops.aten.unfold_backward(squared, [1, n_fft + hop * (frames - 1)], 1, n_fft, hop)[0]
        if envelope[n_fft // 2:].abs().min() < 1e-11:  # what a call may divide by
            raise ValueError("window overlap-add is zero somewhere (NOLA): this window and hop cannot invert")
        _ENVELOPES[key] = envelope
    return _ENVELOPES[key]


@dataclass
class _Block:
    """One block's Griffin-Lim input, between `BlockGriffinLim._prepare` and `_finish`."""
    synth: BlockGriffinLim
    total: int  # mel frames available when the block was taken
    mag: torch.Tensor  # [F, n] linear magnitudes at the synthesis rate
    phase: torch.Tensor  # [F, n] start phases


def synthesize_blocks(synths: Sequence[BlockGriffinLim], segs: Sequence[torch.Tensor],
                      totals: Sequence[int]) -> list[np.ndarray]:
    """The next block of each synthesiser (distinct utterances), Griffin-Lim batched over equal sizes.
    segs[i]: log-mel frames `synths[i].span(totals[i])` [n_i, n_mels]. Returns each block's final audio."""
    blocks = [s._prepare(seg, total) for s, seg, total in zip(synths, segs, totals, strict=True)]

    def run(group: list[_Block]) -> list[np.ndarray]:
        first = group[0].synth
        audio, phase = griffin_lim(first.spec, first.cfg, torch.stack([b.mag for b in group]),
                                   torch.stack([b.phase for b in group]))
        return [b.synth._finish(a.numpy(), p, b.total) for b, a, p in zip(group, audio, phase, strict=True)]

    return batched_by(lambda b: b.mag.shape[-1], blocks, run)


class BlockGriffinLim:
    """Stateful per-utterance block synthesiser; feed it blocks in order."""

    def __init__(self, spec: MelSpec, cfg: BlockGLConfig):
        self.spec, self.cfg = spec, cfg
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

    def span(self, total: int) -> tuple[int, int]:
        """Mel frames [lo, hi) the next block reads, given `total` frames so far."""
        start, end = self.cfg.bounds(self.next_block)
        return max(0, start - self.cfg.left), min(total, end + self.cfg.right)

    def codes_needed(self, context: int = 0) -> int:
        """Frames that must have arrived for the next block: its end, its look-ahead, `context` more."""
        return self.cfg.bounds(self.next_block)[1] + self.cfg.right + context

    def done(self, total: int) -> bool:
        return self.cfg.bounds(self.next_block)[0] >= total

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
        return synthesize_blocks([self], [seg], [total])[0]

    def _prepare(self, seg: torch.Tensor, total: int) -> _Block:
        lo, hi = self.span(total)
        assert seg.shape[0] == hi - lo
        # Interpolate to the synthesis rate in the log domain: [UPSAMPLE * n, n_mels].
        fine = torch.nn.functional.interpolate(seg.T[None], scale_factor=UPSAMPLE, mode="linear",
                                               align_corners=False)[0].T
        mag = self.spec.linear_magnitude(fine)  # [F, UPSAMPLE * n]
        return _Block(self, total, mag, self._initial_phase(UPSAMPLE * lo, mag.shape[1]))

    def _finish(self, audio: np.ndarray, phase: torch.Tensor, total: int) -> np.ndarray:
        """Griffin-Lim's audio [n * hop] and phases of the block -> its final samples; advances the state."""
        cfg, hop = self.cfg, self.spec.hop
        lo, _ = self.span(total)
        start, end = cfg.bounds(self.next_block)
        self.prev_phase, self.prev_start = phase, UPSAMPLE * lo
        # Final samples of this block: [boundary_k - c/2, boundary_{k+1} - c/2), cross-faded at the start.
        offset = lo * hop  # absolute sample of audio[0]
        half = cfg.crossfade // 2
        b0, b1 = start * hop, min(total, end) * hop
        end_final = b1 - half if end < total else b1
        out = audio[max(0, b0 - half) - offset: end_final - offset].copy()
        if self.prev_tail is not None and self.next_block > 0:
            n = min(len(self.prev_tail), len(out))
            ramp = (np.arange(n, dtype=np.float32) + 0.5) / n
            out[:n] = out[:n] * ramp + self.prev_tail[:n] * (1 - ramp)
        self.prev_tail = audio[end_final - offset: end_final - offset + cfg.crossfade].copy()
        self.next_block += 1
        return out.astype(np.float32)
