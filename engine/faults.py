"""Whose fault was it? Running a batched step so that one sequence's failure stays that sequence's.

A batched call that raises is retried on the halves of its batch, down to single sequences, after putting
back what the failed attempt changed (KV positions counted as cached, the sequence's own generator); the
sequences that fail alone are reported, the others' results are kept. A fault that is nobody's (the device
is lost, memory ran out) is not bisected: it raises EngineFault at once. A batch with one poisoned row
costs ~2 log2(B) extra partial steps, once, and then the row is gone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pcgtts.engine.errors import EngineFault
from pcgtts.engine.sequence import Sequence

# Text of errors that say the device or its memory failed (CUDA, ROCm, cuBLAS, NCCL), not one input.
_DEVICE_FAULT_MARKERS = ("CUDA error", "CUDA out of memory", "out of memory", "device-side assert",
                         "illegal memory access", "CUBLAS_STATUS", "cuDNN error", "NCCL", "HIP error",
                         "device lost", "DefaultCPUAllocator: can't allocate memory")


def is_device_fault(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(exc)
    return any(marker in text for marker in _DEVICE_FAULT_MARKERS)


def _seq(item) -> Sequence:
    return item[0] if isinstance(item, tuple) else item


def snapshot(item) -> Callable[[], None]:
    """What a failed step may have changed in one sequence, and a function that puts it back."""
    seq = _seq(item)
    target, draft = seq.target.num_computed, seq.draft.num_computed
    generator = seq.generator.get_state() if seq.generator is not None else None

    def restore() -> None:
        seq.target.num_computed, seq.draft.num_computed = target, draft
        if generator is not None:
            seq.generator.set_state(generator)

    return restore


def isolate_faults(items: list, run: Callable[[list], list | None], snap: Callable = snapshot,
                   failed: list | None = None) -> list:
    """run(items) -> results (a list, or None); on an error, bisect. Appends (sequence, exception) to
    `failed` for each item that fails alone; returns the results of the items that succeeded."""
    if not items:
        return []
    restores = [snap(item) for item in items]
    try:
        return run(items) or []
    except Exception as exc:
        if is_device_fault(exc):
            raise EngineFault(f"{type(exc).__name__}: {exc}") from exc
        for restore in restores:
            restore()
        if len(items) == 1:
            if failed is not None:
                failed.append((_seq(items[0]), exc))
            return []
        mid = len(items) // 2
        return isolate_faults(items[:mid], run, snap, failed) + isolate_faults(items[mid:], run, snap, failed)
