"""`cpu_kernel`: numba's njit for the engine's compiled CPU loops, with its disk cache where it can write one.

numba caches compiled code next to the source (__pycache__) or in the user's cache directory, and refuses to
decorate a `cache=True` function when neither is writable (a read-only install with no writable home): then
the loop is compiled at each start instead (about a second) rather than the import failing.
"""

from __future__ import annotations

from collections.abc import Callable

from numba import njit

# The compiled loops walk each row serially, O(V) per row, and are measured only at the demo vocabulary
# (1,200 tokens): larger vocabularies (Llasa's 65,536 codes and more) keep the vectorised, threaded torch ops.
COMPILED_MAX_V = 16384


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
