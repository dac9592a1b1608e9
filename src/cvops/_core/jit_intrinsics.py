"""Low-level helpers for numba kernels: a cache prefetch hint, streaming (non-temporal) stores and an 8 x 8
register transpose, written with numba's public ``numba.extending.intrinsic`` and llvmlite's ``ir`` builder.
Imports numba, so import it only from kernel modules (the ops' ``cpu_numba``, the numba backend, imported
when the dispatcher chooses it).

Why these exist: gather/scatter kernels whose inner loop reads with a large stride (a new cache line
per element) are latency-bound; the hardware prefetchers do not follow dozens of such streams, so the
kernel prefetches the next row's lines itself (:func:`prefetch`, or :func:`prefetch_l2` for rows that
share a few L1 sets). A kernel that writes a large output once and never reads it back can skip reading
each destination line into the cache first with :func:`stream_store` or, a whole cache line at a time,
:func:`stream_line` (+ :func:`store_fence` before the threads join). Results never change.

Two helpers steer LLVM's vectorisers per loop, where numba only has process-wide switches: :func:`load8`,
:func:`add8` and :func:`store8` keep 8 lanes of sums in one vector register (:class:`Lanes8`), which numba's
default pipeline (SLP vectoriser off) would otherwise leave as 8 scalar chains; and reads through
:func:`scalar_load` keep the loop vectoriser off one loop (strided copies it would turn into AVX-512 gathers,
slower than scalar loads on the CPUs measured) and leave it to the unroller. Both compute exactly what the
plain loop computes.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.extending import intrinsic, models, register_model

# Non-temporal stores are emitted on x86-64 only; elsewhere stream_store is a plain store.
STREAMING = platform.machine().lower() in ("x86_64", "amd64")


def _declare(module: ir.Module, signature: ir.FunctionType, name: str) -> ir.Function:
    """The LLVM function ``name`` declared in ``module`` (once: a kernel may use an intrinsic many times)."""
    try:
        return module.get_global(name)
    except KeyError:
        return ir.Function(module, signature, name)


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
            fn = _declare(builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
                          "llvm.prefetch.p0")
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
            sfence = _declare(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence")
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


_VECTOR_FLOATS = {types.float32: ir.FloatType(), types.float64: ir.DoubleType()}


class Lanes8(types.Type):
    """Eight floats of one dtype (float32 or float64) in one LLVM vector, i.e. one register: see :func:`load8`."""

    def __init__(self, dtype):
        self.dtype = dtype
        super().__init__(name=f"Lanes8({dtype})")


@register_model(Lanes8)
class _Lanes8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_VECTOR_FLOATS[fe_type.dtype], _LANES))


def _flat_floats(array) -> bool:
    return isinstance(array, types.Array) and array.ndim == 1 and array.dtype in _VECTOR_FLOATS


def _lane_pointer(context, builder, array_type, array, index_type, index):
    data = context.make_array(array_type)(context, builder, array).data
    at = context.cast(builder, index, index_type, types.intp)
    vector = ir.VectorType(_VECTOR_FLOATS[array_type.dtype], _LANES)
    return builder.bitcast(builder.gep(data, [at]), vector.as_pointer())


@intrinsic
def load8(typingctx, array, index):
    """``array[index:index + 8]`` as :class:`Lanes8` (1-D contiguous float32/float64 array, every element in
    range: the caller's duty)."""
    if not (_flat_floats(array) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        pointer = _lane_pointer(context, builder, signature.args[0], args[0], signature.args[1], args[1])
        return builder.load(pointer, align=signature.args[0].dtype.bitwidth // 8)

    return Lanes8(array.dtype)(array, index), codegen


@intrinsic
def store8(typingctx, array, index, lanes):
    """``array[index:index + 8] = lanes`` (as :func:`load8`)."""
    if not (_flat_floats(array) and isinstance(index, types.Integer) and lanes == Lanes8(array.dtype)):
        return None

    def codegen(context, builder, signature, args):
        pointer = _lane_pointer(context, builder, signature.args[0], args[0], signature.args[1], args[1])
        builder.store(args[2], pointer, align=signature.args[0].dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.void(array, index, lanes), codegen


@intrinsic
def add8(typingctx, a, b):
    """Lane-wise ``a + b`` of two :class:`Lanes8` (IEEE additions, each lane as the scalar one)."""
    if not (isinstance(a, Lanes8) and a == b):
        return None

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1])

    return a(a, b), codegen


@intrinsic
def zero8(typingctx, array):
    """Eight zeros of ``array``'s dtype as :class:`Lanes8`."""
    if not _flat_floats(array):
        return None

    def codegen(context, builder, signature, args):
        return ir.Constant(ir.VectorType(_VECTOR_FLOATS[signature.args[0].dtype], _LANES), None)

    return Lanes8(array.dtype)(array), codegen


@intrinsic
def scalar_load(typingctx, array, index):
    """``array[index]`` (1-D contiguous array, index in range: the caller's duty) as a load that LLVM's
    vectorisers leave alone: a loop reading through it stays scalar, and is still unrolled. The load is
    LLVM's ``unordered`` atomic one, on x86-64 and AArch64 the same instruction as a plain load; the
    vectorisers widen only plain loads, and unlike a call (an ``asm`` statement, say) it does not stop the
    unroller."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and isinstance(array.dtype, (types.Integer, types.Float))
            and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        array_type, index_type = signature.args
        data = context.make_array(array_type)(context, builder, args[0]).data
        at = context.cast(builder, args[1], index_type, types.intp)
        width = context.get_abi_sizeof(context.get_data_type(array_type.dtype))
        value = builder.load_atomic(builder.gep(data, [at]), "unordered", width)
        return value

    return array.dtype(array, index), codegen
