"""`cpu_kernel`: numba's njit for the engine's compiled CPU loops, with its disk cache where it can write one.

numba caches compiled code next to the source (__pycache__) or in the user's cache directory, and refuses to
decorate a `cache=True` function when neither is writable (a read-only install with no writable home): then
the loop is compiled at each start instead rather than the import failing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# float flags that let LLVM vectorise a loop's sums (reassociate, fuse multiply-adds) while infinities and
# NaNs keep their meaning (numba's fastmath=True would also assume there are none)
REASSOCIATE = frozenset({"reassoc", "contract", "arcp", "nsz"})


def cpu_kernel(signature: str | list[str] | None = None,
               fastmath: frozenset | bool = False) -> Callable[[Callable], Callable]:
    """Decorator: njit(signature, nogil=True), cached on disk when possible. With a signature (or a list of
    them) the loop is compiled at import (or loaded from the cache), not on its first call. fastmath:
    numba's flags (e.g. REASSOCIATE); the sums of such a loop are grouped as the vector width has it, the
    same grouping at every call of one length."""
    args = (signature,) if signature else ()
    flags = set(fastmath) if isinstance(fastmath, frozenset) else fastmath

    def decorate(fn: Callable) -> Callable:
        try:
            return njit(*args, cache=True, nogil=True, fastmath=flags)(fn)
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return njit(*args, nogil=True, fastmath=flags)(fn)

    return decorate


@intrinsic
def as_float32(typingctx, x):
    """x as float32 inside a compiled loop: a float32 as it is, or a uint16 taken as the bits of an IEEE
    half (an fp16 tensor viewed as uint16: numba has no float16 type on the CPU). The widening is exact and
    LLVM vectorises it (vcvtph2ps where the CPU has F16C), so a loop can read fp16 arrays at half the bytes
    and compute on the same float32 values their widening would give."""
    if x == types.uint16:
        def widen(context, builder, signature, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        return types.float32(types.uint16), widen
    if x == types.float32:
        return types.float32(types.float32), lambda context, builder, signature, args: args[0]
    return None


@intrinsic
def stored_as(typingctx, x, store):
    """float32 x as an element of `store` (an array) holds it: itself in a float32 array, in a uint16 array
    (an fp16 tensor's bits) the IEEE half nearest to it, ties to even (LLVM's fptrunc: vcvtps2ph where the
    CPU has F16C), which is what `Tensor.to(torch.float16)` writes."""
    if x != types.float32 or not isinstance(store, types.Array):
        return None
    if store.dtype == types.uint16:
        def narrow(context, builder, signature, args):
            return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return types.uint16(types.float32, store), narrow
    if store.dtype == types.float32:
        return types.float32(types.float32, store), lambda context, builder, signature, args: args[0]
    return None


CACHE_LINE = 64  # bytes


@intrinsic
def prefetch(typingctx, array, i, j, offset):
    """Ask for the cache line `offset` bytes past array[i, j, 0, 0] (a 4-D array) to be brought toward L1
    (LLVM's prefetch: a hint, never a fault, whatever the address). A loop that walks rows of K/V from memory
    issues it a few rows ahead: the hardware prefetcher alone leaves the attention loop waiting on each
    row (the engine's attention calls at batch 16 ran 1.27-1.46x faster with it and with keys past a query
    skipped, bench/results/attention-prefetch)."""
    if not (isinstance(array, types.Array) and array.ndim == 4):
        return None

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        row = cgutils.get_item_pointer(context, builder, array_type, ary,
                                       [args[1], args[2], zero, zero])
        byte = ir.IntType(8).as_pointer()
        address = builder.gep(builder.bitcast(row, byte), [args[3]])
        int32 = ir.IntType(32)
        mangled = "llvm.prefetch.p0" if getattr(byte, "is_opaque", False) else "llvm.prefetch.p0i8"
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte, int32, int32, int32]), mangled)
        # read access, high temporal locality (keep in all levels), data cache
        builder.call(function, [address, int32(0), int32(3), int32(1)])
        return context.get_dummy_value()

    return types.void(array, types.intp, types.intp, types.intp), codegen


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
