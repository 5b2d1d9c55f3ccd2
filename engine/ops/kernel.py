"""`cpu_kernel`: numba's njit for the engine's compiled CPU loops, with its disk cache where it can write one.

numba caches compiled code next to the source (__pycache__) or in the user's cache directory, and refuses to
decorate a `cache=True` function when neither is writable (a read-only install with no writable home): then
the loop is compiled at each start instead rather than the import failing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

# float flags that let LLVM vectorise a loop's sums (reassociate, fuse multiply-adds) while infinities and
# NaNs keep their meaning (numba's fastmath=True would also assume there are none)
REASSOCIATE = frozenset({"reassoc", "contract", "arcp", "nsz"})


def cpu_kernel(signature: str | None = None,
               fastmath: frozenset | bool = False) -> Callable[[Callable], Callable]:
    """Decorator: njit(signature, nogil=True), cached on disk when possible. With a signature the loop is
    compiled at import (or loaded from the cache), not on its first call. fastmath: numba's flags (e.g.
    REASSOCIATE); the sums of such a loop are grouped as the vector width has it, the same grouping at
    every call of one length."""
    args = (signature,) if signature else ()
    flags = set(fastmath) if isinstance(fastmath, frozenset) else fastmath

    def decorate(fn: Callable) -> Callable:
        try:
            return njit(*args, cache=True, nogil=True, fastmath=flags)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return njit(*args, nogil=True, fastmath=flags)(fn)

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
