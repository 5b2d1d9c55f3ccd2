"""`cpu_kernel`: numba's njit for the engine's compiled CPU loops, with its disk cache where it can write one.

numba caches compiled code next to the source (__pycache__) or in the user's cache directory, and refuses to
decorate a `cache=True` function when neither is writable (a read-only install with no writable home): then
the loop is compiled at each start instead (about a second) rather than the import failing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from numba import njit

# The compiled loops walk each row serially, O(V) per row, and are measured only at the demo vocabulary
# (1,200 tokens): larger vocabularies (Llasa's 65,536 codes and more) keep the vectorised, threaded torch ops.
COMPILED_MAX_V = 16384


def compiled_applies(device: torch.device | str, vocab_size: int) -> bool:
    """Whether the compiled loops serve tensors on `device` over `vocab_size` tokens (else: torch ops)."""
    return torch.device(device).type == "cpu" and vocab_size <= COMPILED_MAX_V


def cpu_kernel(signature: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: njit(signature, nogil=True), cached on disk when possible. With a signature the loop is
    compiled at import (or loaded from the cache), not on its first call."""
    args = (signature,) if signature else ()

    def decorate(fn: Callable) -> Callable:
        try:
            return njit(*args, cache=True, nogil=True)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return njit(*args, nogil=True)(fn)

    return decorate


@cpu_kernel()
def draw_index(weights: np.ndarray, u: float) -> int:
    """Index drawn ∝ nonnegative `weights` by inverse CDF, the search `sample_rows` makes: the first index
    whose float64 cumulative sum exceeds u·total (so a zero weight is never drawn); if rounding passes every
    step, the last positive weight."""
    total = 0.0
    for j in range(weights.shape[0]):
        total += weights[j]
    target = u * total
    acc = 0.0
    last_positive = 0
    for j in range(weights.shape[0]):
        if weights[j] > 0.0:
            last_positive = j
            acc += weights[j]
            if acc > target:
                return j
    return last_positive
