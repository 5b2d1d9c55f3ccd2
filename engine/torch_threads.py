"""Torch's intra-op thread count, applied in every thread that runs model code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def adopt_torch_threads(count: int | None = None) -> None:
    """Give the calling thread `count` intra-op threads, or, without one, the count torch was configured
    with (`torch.set_num_threads`).

    torch records the count process-wide, but OpenMP, which runs torch's and MKL's parallel regions, keeps
    it per OS thread: a thread started after the setting runs its parallel regions with OpenMP's default,
    one worker per core. On a small CPU the engine and codec threads then each spread over every core and
    spin against each other, each slower than with the count applied in-thread. Call at the start of each
    worker thread. The record torch keeps is rewritten by every call, so a thread that must keep its own
    count while another sets a different one (the codec's beside the engine's `EngineConfig.threads`) is
    given it explicitly, read before the other thread starts."""
    torch.set_num_threads(count or torch.get_num_threads())


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with `count` intra-op threads in this thread (None: as it is), then restore the
    count: what runs on the engine thread's count but in the constructing thread (Engine's start-up
    calibration of batch-invariant shapes, which depend on how many threads split a product)."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if count:
            torch.set_num_threads(before)

