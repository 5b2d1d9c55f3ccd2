"""Log-mel analysis shared by the demo codec's encoder, its decoder targets and the training recipe.

16 kHz audio, 50 frames/s (hop 320), 80 mel bands, natural-log magnitudes floored at -5. Frame i covers
samples [320 i, 320 (i + 1)) (centred STFT, the trailing partial frame dropped), so `n` frames decode to
exactly `320 n` samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

SAMPLE_RATE = 16000
HOP = 320
N_FFT = 1024
N_MELS = 80
LOG_FLOOR = 6.7379e-3  # exp(-5): ~70 dB below loud speech bins; quieter detail is inaudible noise


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + f / 700.0)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


@dataclass(frozen=True)
class MelSpec:
    sample_rate: int = SAMPLE_RATE
    hop: int = HOP
    n_fft: int = N_FFT
    n_mels: int = N_MELS

    @cached_property
    def band_edges(self) -> np.ndarray:
        """Hz [n_mels + 2]: filter k rises from edges[k] to its centre edges[k + 1], falls to edges[k + 2]."""
        return _mel_to_hz(np.linspace(0, _hz_to_mel(np.array(self.sample_rate / 2)), self.n_mels + 2))

    @cached_property
    def filterbank(self) -> torch.Tensor:
        """Triangular HTK-style mel filters, [n_mels, n_fft // 2 + 1]."""
        freqs = np.linspace(0, self.sample_rate / 2, self.n_fft // 2 + 1)
        edges = self.band_edges
        lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
        up = (freqs[None] - lower) / (centre - lower)
        down = (upper - freqs[None]) / (upper - centre)
        fb = np.maximum(0.0, np.minimum(up, down))
        return torch.from_numpy(fb.astype(np.float32))

    @cached_property
    def inverse_filterbank(self) -> torch.Tensor:
        """Least-squares map from mel to linear magnitudes, [n_fft // 2 + 1, n_mels]."""
        return torch.linalg.pinv(self.filterbank)

    @cached_property
    def window(self) -> torch.Tensor:
        return torch.hann_window(self.n_fft)

    def num_frames(self, num_samples: int) -> int:
        return num_samples // self.hop

    def log_mel(self, audio: np.ndarray | torch.Tensor) -> torch.Tensor:
        """audio float [samples] at sample_rate -> log-mel float32 [frames, n_mels]."""
        x = torch.as_tensor(np.asarray(audio, dtype=np.float32))
        frames = self.num_frames(x.shape[-1])
        if frames == 0:
            return torch.zeros(0, self.n_mels)
        spec = torch.stft(x[: frames * self.hop], self.n_fft, self.hop, window=self.window, center=True,
                          return_complex=True)  # [F, frames + 1]
        mag = spec.abs()[:, :frames]
        return torch.log(torch.clamp(self.filterbank @ mag, min=LOG_FLOOR)).T.contiguous()

    def linear_magnitude(self, log_mel: torch.Tensor) -> torch.Tensor:
        """log-mel [frames, n_mels] -> non-negative linear magnitudes [n_fft // 2 + 1, frames]."""
        return torch.clamp(self.inverse_filterbank @ torch.exp(log_mel).T, min=0.0)
