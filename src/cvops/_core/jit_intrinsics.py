"""Low-level helpers for numba kernels, written with numba's public ``numba.extending.intrinsic`` and
llvmlite's ``ir`` builder (why each exists: docs/ARCHITECTURE.md, numba): cache prefetch hints, streaming
(non-temporal) stores, an 8 x 8 register transpose, 8-lane vector sums (:class:`Lanes8`) and a load that
keeps LLVM's vectorisers off one loop. Each computes exactly what the plain loop computes. Imports numba:
import it only from kernel modules (the ops' ``cpu_numba``, imported when the dispatcher chooses numba).
Offsets are in elements and in range: the caller's duty, nothing is checked.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.extending import intrinsic, models, register_model

# Non-temporal stores are emitted on x86-64 only; elsewhere they are plain stores.
STREAMING = platform.machine().lower() in ("x86_64", "amd64")
_LANES = 8  # transpose8's block size and Lanes8's width
_VECTOR_FLOATS = {types.float32: ir.FloatType(), types.float64: ir.DoubleType()}


def _declare(module: ir.Module, signature: ir.FunctionType, name: str) -> ir.Function:
    """The LLVM function ``name`` declared in ``module`` (once: a kernel may use an intrinsic many times)."""
    try:
        return module.get_global(name)
    except KeyError:
        return ir.Function(module, signature, name)


def _address(context, builder, array_type, array, at, pointee=None):
    """The address of ``array[at]`` (``at``: an intp value), as a pointer to ``pointee`` when given."""
    address = builder.gep(context.make_array(array_type)(context, builder, array).data, [at])
    return address if pointee is None else builder.bitcast(address, pointee.as_pointer())


def _pointer(context, builder, signature, args, k: int, pointee=None):
    """:func:`_address` of ``args[k][args[k + 1]]``, an array argument and its index."""
    at = context.cast(builder, args[k + 1], signature.args[k + 1], types.intp)
    return _address(context, builder, signature.args[k], args[k], at, pointee)


def _nontemporal(builder, store) -> None:
    if STREAMING:
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))


def _flat(array, dtypes=None) -> bool:
    """A 1-D array (of one of ``dtypes`` when given)."""
    return isinstance(array, types.Array) and array.ndim == 1 and (dtypes is None or array.dtype in dtypes)


def _prefetch_intrinsic(name: str, locality: int, doc: str):
    """A prefetch intrinsic ``name(array, index)`` with LLVM's temporal ``locality`` (3: into L1, 2: into L2)."""
    def typer(typingctx, array, index):
        if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            byte_ptr, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = _declare(builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
                          "llvm.prefetch.p0")
            # (address, read, temporal locality, data cache)
            builder.call(fn, [_pointer(context, builder, signature, args, 0, ir.IntType(8)), i32(0), i32(locality),
                              i32(1)])
            return context.get_dummy_value()

        return types.void(array, index), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


prefetch = _prefetch_intrinsic("prefetch", 3, """Hint the CPU to bring ``array[index]``'s cache line into L1
    (a no-op for the result; an index outside the array is harmless: prefetches never fault).""")
prefetch_l2 = _prefetch_intrinsic("prefetch_l2", 2, """As :func:`prefetch`, into L2 but not L1: for rows a
    large power of two apart, which all map to the same few L1 sets.""")


@intrinsic
def stream_store(typingctx, array, index, value):
    """``array[index] = value`` (1-D contiguous array) as a non-temporal store on x86-64."""
    def codegen(context, builder, signature, args):
        value = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
        _nontemporal(builder, builder.store(value, _pointer(context, builder, signature, args, 0)))
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@intrinsic
def stream_line(typingctx, dst, dst_at, src, src_at):
    """``dst[dst_at + i] = src[src_at + i]`` for the ``64 // itemsize`` elements of one cache line, as one
    vector load and one non-temporal vector store on x86-64 (a whole-line store leaves the write-combining
    buffer full at once). ``dst``, ``src``: 1-D contiguous arrays of one dtype; ``dst_at`` must address a
    64-byte aligned element."""
    if not (_flat(dst) and _flat(src) and dst.dtype == src.dtype and isinstance(dst_at, types.Integer)
            and isinstance(src_at, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        width = signature.args[0].dtype.bitwidth // 8
        vector = ir.VectorType(context.get_data_type(signature.args[0].dtype), 64 // width)
        line = builder.load(_pointer(context, builder, signature, args, 2, vector), align=width)
        _nontemporal(builder, builder.store(line, _pointer(context, builder, signature, args, 0, vector), align=64))
        return context.get_dummy_value()

    return types.void(dst, dst_at, src, src_at), codegen


@intrinsic
def store_fence(typingctx):
    """``sfence`` on x86-64: streaming stores before it are visible before any store after it."""
    def codegen(context, builder, signature, args):
        if STREAMING:
            builder.call(_declare(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence"), [])
        return context.get_dummy_value()

    return types.void(), codegen


# one "perfect shuffle" round: vector pair (a, b) -> (a0 b0 a1 b1 a2 b2 a3 b3), (a4 b4 ... a7 b7); applied to
# rows (i, i + 4) -> outputs (2i, 2i + 1), three rounds transpose an 8 x 8 block (LLVM emits unpack/permute)
_INTERLEAVE_LOW = [j for i in range(_LANES // 2) for j in (i, _LANES + i)]
_INTERLEAVE_HIGH = [j for i in range(_LANES // 2, _LANES) for j in (i, _LANES + i)]


@intrinsic
def transpose8(typingctx, src, src_at, src_stride, dst, dst_at, dst_stride):
    """``dst[dst_at + j*dst_stride + r] = src[src_at + r*src_stride + j]`` for r, j < 8: an 8 x 8 block
    transposed in registers (8 vector loads, 24 shuffles, 8 vector stores) and converted to dst's dtype.
    ``src``, ``dst``: 1-D contiguous float32/float64 arrays. LLVM compiles a scalar transpose loop to one load
    and one store per element (or to AVX-512 gathers, slower still on AMD EPYC CPUs)."""
    if not (_flat(src, _VECTOR_FLOATS) and _flat(dst, _VECTOR_FLOATS)):
        return None

    def codegen(context, builder, signature, args):
        src_type, dst_type = signature.args[0], signature.args[3]

        def row_pointers(k, array_type):
            vector = ir.VectorType(_VECTOR_FLOATS[array_type.dtype], _LANES)
            at, stride = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (k + 1, k + 2))
            starts = [builder.add(at, builder.mul(stride, stride.type(r))) for r in range(_LANES)]
            return [_address(context, builder, array_type, args[k], start, vector) for start in starts]

        rows = [builder.load(p, align=src_type.dtype.bitwidth // 8) for p in row_pointers(0, src_type)]
        mask_type = ir.VectorType(ir.IntType(32), _LANES)
        low, high = (ir.Constant(mask_type, [ir.IntType(32)(j) for j in mask])
                     for mask in (_INTERLEAVE_LOW, _INTERLEAVE_HIGH))
        for _ in range(3):
            shuffled = []
            for i in range(_LANES // 2):
                a, b = rows[i], rows[i + _LANES // 2]
                shuffled += [builder.shuffle_vector(a, b, low), builder.shuffle_vector(a, b, high)]
            rows = shuffled
        dst_vector = ir.VectorType(_VECTOR_FLOATS[dst_type.dtype], _LANES)
        for value, pointer in zip(rows, row_pointers(3, dst_type)):
            if dst_type.dtype.bitwidth > src_type.dtype.bitwidth:
                value = builder.fpext(value, dst_vector)
            elif dst_type.dtype.bitwidth < src_type.dtype.bitwidth:
                value = builder.fptrunc(value, dst_vector)
            builder.store(value, pointer, align=dst_type.dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.void(src, src_at, src_stride, dst, dst_at, dst_stride), codegen


class Lanes8(types.Type):
    """Eight floats of one dtype (float32 or float64) in one LLVM vector, i.e. one register: numba's default
    pipeline (SLP vectoriser off) would leave eight sums as eight scalar chains. See :func:`load8`."""

    def __init__(self, dtype):
        self.dtype = dtype
        super().__init__(name=f"Lanes8({dtype})")


@register_model(Lanes8)
class _Lanes8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_VECTOR_FLOATS[fe_type.dtype], _LANES))


def _lanes_pointer(context, builder, signature, args):
    vector = ir.VectorType(_VECTOR_FLOATS[signature.args[0].dtype], _LANES)
    return _pointer(context, builder, signature, args, 0, vector)


@intrinsic
def load8(typingctx, array, index):
    """``array[index:index + 8]`` as :class:`Lanes8` (1-D contiguous float32/float64 array)."""
    if not (_flat(array, _VECTOR_FLOATS) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        return builder.load(_lanes_pointer(context, builder, signature, args), align=array.dtype.bitwidth // 8)

    return Lanes8(array.dtype)(array, index), codegen


@intrinsic
def store8(typingctx, array, index, lanes):
    """``array[index:index + 8] = lanes`` (as :func:`load8`)."""
    if not (_flat(array, _VECTOR_FLOATS) and isinstance(index, types.Integer) and lanes == Lanes8(array.dtype)):
        return None

    def codegen(context, builder, signature, args):
        builder.store(args[2], _lanes_pointer(context, builder, signature, args), align=array.dtype.bitwidth // 8)
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
    if not _flat(array, _VECTOR_FLOATS):
        return None

    def codegen(context, builder, signature, args):
        return ir.Constant(ir.VectorType(_VECTOR_FLOATS[array.dtype], _LANES), None)

    return Lanes8(array.dtype)(array), codegen


@intrinsic
def scalar_load(typingctx, array, index):
    """``array[index]`` (1-D contiguous array) as a load that LLVM's vectorisers leave alone: a loop reading
    through it stays scalar (strided copies it would turn into AVX-512 gathers, slower than scalar loads on
    the CPUs measured) and is still unrolled. It is LLVM's ``unordered`` atomic load, on x86-64 and AArch64
    the same instruction as a plain load: the vectorisers widen only plain loads, and unlike a call (an
    ``asm`` statement, say) it does not stop the unroller."""
    if not (_flat(array) and isinstance(array.dtype, (types.Integer, types.Float))
            and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        width = context.get_abi_sizeof(context.get_data_type(array.dtype))
        return builder.load_atomic(_pointer(context, builder, signature, args, 0), "unordered", width)

    return array.dtype(array, index), codegen
