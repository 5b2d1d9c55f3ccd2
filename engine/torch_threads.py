"""Torch's intra-op thread count, applied in every thread that runs model code."""

from __future__ import annotations

import torch


def adopt_torch_threads() -> None:
    """Give the calling thread the intra-op thread count torch was configured with (`torch.set_num_threads`).

    torch records the count process-wide, but OpenMP, which runs torch's and MKL's parallel regions, keeps
    it per OS thread: a thread started after the setting runs its parallel regions with OpenMP's default,
    one worker per core. On a small CPU the engine and codec threads then each spread over every core and
    spin against each other, each slower than with the count applied in-thread. Call at the start of each
    worker thread."""
    torch.set_num_threads(torch.get_num_threads())
