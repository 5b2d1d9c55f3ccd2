"""Fit the demo codec's codebook: k-means over log-mel frames of the corpus, then encode the corpus.

Lloyd iterations in torch on a seeded sample of frames (k-means++-style seeding would cost more than it
saves here: with ~10^6 frames every code gets hundreds of members); empty clusters are re-seeded from
the frames worst served by their centroid.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from pcgtts.engine.codec.demo.features import LOG_FLOOR


def nearest(frames: torch.Tensor, centroids: torch.Tensor,
            chunk: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
    """frames [N, D], centroids [K, D] -> (index [N], squared distance [N])."""
    c_sq = (centroids * centroids).sum(1)  # [K]
    idx, dist = [], []
    for s in range(0, len(frames), chunk):
        x = frames[s:s + chunk]
        d = c_sq[None] - 2 * x @ centroids.T  # [n, K], up to the constant |x|^2
        best, arg = d.min(1)
        idx.append(arg)
        dist.append(best + (x * x).sum(1))
    return torch.cat(idx), torch.cat(dist)


def fit_kmeans(frames: torch.Tensor, k: int, iterations: int = 20, seed: int = 0) -> torch.Tensor:
    """frames [N, D] float32 -> centroids [k, D]."""
    gen = torch.Generator().manual_seed(seed)
    centroids = frames[torch.randperm(len(frames), generator=gen)[:k]].clone()
    start = time.time()
    for it in range(iterations):
        idx, dist = nearest(frames, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, idx, frames)
        counts = torch.bincount(idx, minlength=k).float()
        empty = counts == 0
        centroids = torch.where(empty[:, None], centroids, sums / counts.clamp(min=1)[:, None])
        if empty.any():  # re-seed from the worst-served frames
            worst = dist.topk(int(empty.sum())).indices
            centroids[empty] = frames[worst]
        print(f"[kmeans] iter {it + 1}/{iterations} mse/dim {dist.mean().item() / frames.shape[1]:.4f} "
              f"empty {int(empty.sum())} {time.time() - start:.0f}s", flush=True)
    return centroids


def sample_frames(mels: list[np.ndarray], num: int, seed: int = 0) -> torch.Tensor:
    """A seeded uniform sample of `num` frames from the corpus, floored like the codec's features."""
    all_frames = np.concatenate(mels)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(all_frames), size=min(num, len(all_frames)), replace=False)
    return torch.from_numpy(all_frames[np.sort(pick)].astype(np.float32)).clamp(min=float(np.log(LOG_FLOOR)))
