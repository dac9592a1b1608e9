"""Low-level helpers for numba kernels: a cache prefetch hint, streaming (non-temporal) stores, an 8 x 8
register transpose, and compiling a kernel with LLVM's loop vectoriser off or its SLP vectoriser on. Imports
numba, so import it only from kernel modules (the ops' ``cpu_numba``, which ``jit.numba_kernels`` imports
when numba is on).

Why these exist: gather/scatter kernels whose inner loop reads with a large stride (a new cache line
per element) are latency-bound; the hardware prefetchers do not follow dozens of such streams, so the
kernel prefetches the next row's lines itself (:func:`prefetch`, or :func:`prefetch_l2` for rows that
share a few L1 sets). And LLVM turns such strided loops into AVX-512 gathers, which on AMD EPYC CPUs run
slower than plain scalar loads; numba has no per-function switch, so :func:`compile_scalar` compiles with
``numba.config.LOOP_VECTORIZE`` off (the documented ``NUMBA_LOOP_VECTORIZE`` setting, which numba reads at
each compilation); :func:`compile_slp` likewise turns ``SLP_VECTORIZE`` on for kernels written as short
straight-line runs. A kernel that writes a large output once and never reads it back can skip reading
each destination line into the cache first with :func:`stream_store` or, a whole cache line at a time,
:func:`stream_line` (+ :func:`store_fence` before the threads join). Results never change.
"""
from __future__ import annotations

import functools
import platform
import threading

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit_background import compile_elsewhere

_compile_lock = threading.Lock()
# Non-temporal stores are emitted on x86-64 only; elsewhere stream_store is a plain store.
STREAMING = platform.machine().lower() in ("x86_64", "amd64")


def _prefetch_intrinsic(name: str, locality: int, doc: str):
    """A prefetch intrinsic ``name(array, index)`` with LLVM's temporal ``locality`` (3: into L1, 2: into L2)."""
    def typer(typingctx, array, index):
        if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            array_type, index_type = signature.args
            data = context.make_array(array_type)(context, builder, args[0]).data
            offset = context.cast(builder, args[1], index_type, types.intp)
            byte_ptr = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]), "llvm.prefetch.p0")
            # (address, read, temporal locality, data cache)
            builder.call(fn, [builder.bitcast(builder.gep(data, [offset]), byte_ptr), i32(0), i32(locality),
                              i32(1)])
            return context.get_dummy_value()

        return types.void(array, index), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


prefetch = _prefetch_intrinsic("prefetch", 3, """Hint the CPU to bring ``array[index]``'s cache line into L1
    (a no-op for the result; an index outside the array is harmless: prefetches never fault).""")
prefetch_l2 = _prefetch_intrinsic("prefetch_l2", 2, """As :func:`prefetch`, into L2 but not L1: for rows a
    large power of two apart, which all map to the same few L1 sets, where lines prefetched into L1
    evict the ones in use.""")


def _compile_with(dispatcher, signature, **settings) -> None:
    """Compile (or load from numba's cache) ``dispatcher`` for ``signature`` with numba.config ``settings``
    (e.g. ``LOOP_VECTORIZE=0``) in force. numba has no per-function switch for these; it reads them when
    it builds each compilation's pass manager, so they are set for that moment only. Another kernel
    compiled by another thread at the same moment gets them too (slower at worst, never wrong). A kernel
    whose compilation is deferred (``jit_background``) goes to the worker instead: KernelNotReady."""
    if any(tuple(s) == tuple(signature) for s in dispatcher.signatures):
        return
    compile_elsewhere(dispatcher, tuple(signature), functools.partial(_compile_with, dispatcher, signature, **settings))
    with _compile_lock:
        if any(tuple(s) == tuple(signature) for s in dispatcher.signatures):
            return
        previous = {name: getattr(numba.config, name) for name in settings}
        for name, value in settings.items():
            setattr(numba.config, name, value)
        try:
            dispatcher.compile(tuple(signature))
        finally:
            for name, value in previous.items():
                setattr(numba.config, name, value)


def compile_scalar(dispatcher, signature) -> None:
    """Compile ``dispatcher`` for ``signature`` with loop vectorisation off. Call before the first call of
    that signature."""
    _compile_with(dispatcher, signature, LOOP_VECTORIZE=0)


def compile_slp(dispatcher, signature) -> None:
    """Compile ``dispatcher`` for ``signature`` with LLVM's SLP vectoriser on (numba leaves it off): it
    packs runs of straight-line scalar code, such as eight loads from consecutive addresses followed by
    eight stores, into vector instructions. Call before the first call of that signature."""
    _compile_with(dispatcher, signature, SLP_VECTORIZE=1)


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
def stream_line(typingctx, dst, dst_at, src, src_at):
    """``dst[dst_at + i] = src[src_at + i]`` for the ``64 // itemsize`` elements of one cache line, as one
    vector load and one non-temporal vector store on x86-64 (a plain vector store elsewhere). ``dst``,
    ``src``: 1-D contiguous arrays of one dtype; ``dst_at`` must address a 64-byte aligned element (the
    caller's duty: nothing is checked). Why: scalar streaming stores split a line into several stores,
    while a whole-line one leaves the write-combining buffer full at once."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.ndim == 1 and src.ndim == 1
            and dst.dtype == src.dtype and isinstance(dst_at, types.Integer) and isinstance(src_at, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        width = array_type.dtype.bitwidth // 8
        vector = ir.VectorType(context.get_data_type(array_type.dtype), 64 // width)

        def pointer(k):
            data = context.make_array(signature.args[k])(context, builder, args[k]).data
            at = context.cast(builder, args[k + 1], signature.args[k + 1], types.intp)
            return builder.bitcast(builder.gep(data, [at]), vector.as_pointer())

        store = builder.store(builder.load(pointer(2), align=width), pointer(0), align=64)
        if STREAMING:
            store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(dst, dst_at, src, src_at), codegen


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



_LANES = 8  # transpose8's block size
# one "perfect shuffle" round: vector pair (a, b) -> (a0 b0 a1 b1 a2 b2 a3 b3), (a4 b4 ... a7 b7); applied to
# rows (i, i + 4) -> outputs (2i, 2i + 1), three rounds transpose an 8 x 8 block (LLVM emits unpack/permute)
_INTERLEAVE_LOW = [j for i in range(_LANES // 2) for j in (i, _LANES + i)]
_INTERLEAVE_HIGH = [j for i in range(_LANES // 2, _LANES) for j in (i, _LANES + i)]


@intrinsic
def transpose8(typingctx, src, src_at, src_stride, dst, dst_at, dst_stride):
    """``dst[dst_at + j*dst_stride + r] = src[src_at + r*src_stride + j]`` for r, j < 8: an 8 x 8 block
    transposed in registers (8 vector loads, 24 shuffles, 8 vector stores) and converted to dst's dtype.
    ``src``, ``dst``: 1-D contiguous float32/float64 arrays; offsets in elements, every row in range (the
    caller's duty: nothing is checked).

    Why: regrouping interleaved channels is a transpose, and LLVM compiles a scalar transpose loop to one
    load and one store per element (or to AVX-512 gathers, slower still on AMD EPYC CPUs)."""
    floats = (types.float32, types.float64)
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array) and src.ndim == 1 and dst.ndim == 1
            and src.dtype in floats and dst.dtype in floats):
        return None

    def codegen(context, builder, signature, args):
        src_type, dst_type = signature.args[0], signature.args[3]
        src_vec = ir.VectorType(context.get_data_type(src_type.dtype), _LANES)
        dst_vec = ir.VectorType(context.get_data_type(dst_type.dtype), _LANES)

        def row_pointers(array_index, at_index, vector_type, array_type):
            data = context.make_array(array_type)(context, builder, args[array_index]).data
            at, stride = (context.cast(builder, args[k], signature.args[k], types.intp)
                          for k in (at_index, at_index + 1))
            return [builder.bitcast(builder.gep(data, [builder.add(at, builder.mul(stride, stride.type(r)))]),
                                    vector_type.as_pointer()) for r in range(_LANES)]

        rows = [builder.load(p, align=src_type.dtype.bitwidth // 8) for p in row_pointers(0, 1, src_vec, src_type)]
        mask_type = ir.VectorType(ir.IntType(32), _LANES)
        low, high = (ir.Constant(mask_type, [ir.IntType(32)(j) for j in mask])
                     for mask in (_INTERLEAVE_LOW, _INTERLEAVE_HIGH))
        for _ in range(3):
            shuffled = []
            for i in range(_LANES // 2):
                a, b = rows[i], rows[i + _LANES // 2]
                shuffled += [builder.shuffle_vector(a, b, low), builder.shuffle_vector(a, b, high)]
            rows = shuffled
        widen = dst_type.dtype.bitwidth > src_type.dtype.bitwidth
        narrow = dst_type.dtype.bitwidth < src_type.dtype.bitwidth
        for value, pointer in zip(rows, row_pointers(3, 4, dst_vec, dst_type)):
            if widen:
                value = builder.fpext(value, dst_vec)
            elif narrow:
                value = builder.fptrunc(value, dst_vec)
            builder.store(value, pointer, align=dst_type.dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.void(src, src_at, src_stride, dst, dst_at, dst_stride), codegen
