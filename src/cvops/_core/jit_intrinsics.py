"""Low-level helpers for numba kernels: a cache prefetch hint, streaming (non-temporal) stores, and
compiling a kernel without LLVM's loop vectoriser. Imports numba, so import it only from kernel modules (after ``jit.numba_enabled()``).

Why these exist: gather/scatter kernels whose inner loop reads with a large stride (a new cache line
per element) are latency-bound; the hardware prefetchers do not follow dozens of such streams, so the
kernel prefetches the next row's lines itself (:func:`prefetch`). And LLVM turns such strided loops into
AVX-512 gathers, which on the CI machine (AMD EPYC) run ~1.5x slower than plain scalar loads; numba has no
per-function switch, so :func:`compile_scalar` compiles with ``numba.config.LOOP_VECTORIZE`` off (the
documented ``NUMBA_LOOP_VECTORIZE`` setting, which numba reads at each compilation). A kernel that
writes a large output once and never reads it back can skip reading each destination line into the
cache first with :func:`stream_store` (+ :func:`store_fence` before the threads join). Results never
change.
"""
from __future__ import annotations

import platform
import threading

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_compile_lock = threading.Lock()
# Non-temporal stores are emitted on x86-64 only; elsewhere stream_store is a plain store.
STREAMING = platform.machine().lower() in ("x86_64", "amd64")


@intrinsic
def prefetch(typingctx, array, index):
    """Hint the CPU to bring ``array[index]``'s cache line into L1 (a no-op for the result; an index
    outside the array is harmless: prefetches never fault)."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        array_type, index_type = signature.args
        data = context.make_array(array_type)(context, builder, args[0]).data
        offset = context.cast(builder, args[1], index_type, types.intp)
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        # (address, read, highest temporal locality, data cache)
        builder.call(fn, [builder.bitcast(builder.gep(data, [offset]), byte_ptr), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen


def compile_scalar(dispatcher, signature) -> None:
    """Compile (or load from numba's cache) ``dispatcher`` for ``signature`` with loop vectorisation off.

    Call before the first call of that signature. Another kernel compiled by another thread at the same
    moment also gets no loop vectorisation (slower at worst, never wrong).
    """
    with _compile_lock:
        if any(tuple(s) == tuple(signature) for s in dispatcher.signatures):
            return
        previous = numba.config.LOOP_VECTORIZE
        numba.config.LOOP_VECTORIZE = 0
        try:
            dispatcher.compile(tuple(signature))
        finally:
            numba.config.LOOP_VECTORIZE = previous


@intrinsic
def stream_store(typingctx, array, index, value):
    """``array[index] = value`` (1-D contiguous array, index in range) as a non-temporal store on x86-64,
    a plain store elsewhere."""
    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        data = context.make_array(array_type)(context, builder, args[0]).data
        value = context.cast(builder, args[2], signature.args[2], array_type.dtype)
        store = builder.store(value, builder.gep(data, [args[1]]))
        if STREAMING:
            store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@intrinsic
def store_fence(typingctx):
    """``sfence`` on x86-64: streaming stores before it are visible before any store after it."""
    def codegen(context, builder, signature, args):
        if STREAMING:
            sfence = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                    "llvm.x86.sse.sfence")
            builder.call(sfence, [])
        return context.get_dummy_value()

    return types.void(), codegen
