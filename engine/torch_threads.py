"""Set-up of every thread that runs model code: torch's intra-op thread count, and its name as the OS
shows it."""

from __future__ import annotations

import ctypes
import sys
import threading

import torch

_PR_SET_NAME = 15  # prctl(2): the calling thread's name, at most 15 bytes


def adopt_torch_threads() -> None:
    """Give the calling thread the intra-op thread count torch was configured with (`torch.set_num_threads`).

    torch records the count process-wide, but OpenMP, which runs torch's and MKL's parallel regions, keeps
    it per OS thread: a thread started after the setting runs its parallel regions with OpenMP's default,
    one worker per core. On a small CPU the engine and codec threads then each spread over every core and
    spin against each other, each slower than with the count applied in-thread. Call at the start of each
    worker thread."""
    torch.set_num_threads(torch.get_num_threads())


def name_native_thread(name: str | None = None) -> None:
    """Show the calling thread to the OS under its Python name (or `name`), at most 15 bytes: `top -H`,
    `ps -L` and /proc/PID/task/TID/comm then tell the engine's, the codec's and the event loop's CPU apart
    on a served load. Linux only; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        shown = (name or threading.current_thread().name).encode()[:15]
        ctypes.CDLL(None).prctl(_PR_SET_NAME, shown, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: the name is only a convenience
        pass
