"""adopt_torch_threads: a worker thread runs its OpenMP parallel regions with torch's configured count."""

from __future__ import annotations

import ctypes
import os
import threading

import pytest
import torch
from pcgtts.engine.torch_threads import adopt_torch_threads


def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch runs its parallel regions on (libgomp / libiomp), or None.

    Other wheels ship their own copy (sentencepiece brings a second libgomp), so the one meant is the runtime
    whose per-thread count follows torch.set_num_threads in this thread."""
    torch.ones(1)  # make sure torch's libraries are mapped
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line})
    except OSError:
        return None
    before = torch.get_num_threads()
    try:
        for path in paths:
            runtime = ctypes.CDLL(path)
            if all(_follows(runtime, n) for n in (1, 2)):
                return runtime
    finally:
        torch.set_num_threads(before)
    return None


def _follows(runtime: ctypes.CDLL, n: int) -> bool:
    torch.set_num_threads(n)
    return runtime.omp_get_max_threads() == n


@pytest.mark.skipif(_openmp() is None or (os.cpu_count() or 1) < 2,
                    reason="needs torch's OpenMP runtime and at least 2 cores")
def test_a_new_thread_uses_openmps_default_until_it_adopts_torchs_thread_count():
    omp = _openmp()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    seen = {}

    def worker():
        seen["default"] = omp.omp_get_max_threads()  # what a thread gets without adopting
        adopt_torch_threads()
        seen["adopted"] = omp.omp_get_max_threads()

    try:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(before)
    assert seen["adopted"] == 1
    assert seen["default"] == int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))  # why it exists
