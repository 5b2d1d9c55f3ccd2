"""cpu_kernel: a compiled loop still builds where numba can write no cache (a read-only install)."""

from __future__ import annotations

import numba.core.caching
from pcgtts.engine.ops.kernel import cpu_kernel


def test_kernels_compile_without_a_writable_cache(monkeypatch):
    def no_locator(self, py_func):
        raise RuntimeError("cannot cache function: no locator available for file")

    monkeypatch.setattr(numba.core.caching.CacheImpl, "__init__", no_locator)

    @cpu_kernel("int64(int64)")
    def eager(x):
        return x + 1

    @cpu_kernel()
    def lazy(x):
        return x * 2

    assert eager(2) == 3 and lazy(3) == 6
