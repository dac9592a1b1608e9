"""Element access for numba kernels that serve every float dtype: :func:`load` / :func:`store` read and write
float16 and bfloat16 storage in place through their bits (numba has no 16-bit floats on the CPU), so a kernel
needs no widened copy of a half-precision tensor, and :func:`transpose` regroups interleaved channels (8 x 8
register blocks for float32/float64, element by element otherwise). Imports numba: import it from kernel
modules only (the ops' ``cpu_numba``, the numba backend, imported when the dispatcher chooses it).

Pass float16 storage as uint16 (``t.view(torch.int16).numpy().view(np.uint16)``) and bfloat16 as int16
(``t.view(torch.int16).numpy()``): the array's dtype tells the two apart. Stores round to nearest even, as
torch converts.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from .jit import njit
from .jit_intrinsics import transpose8

_LANES = 8


@intrinsic
def _half_bits_to_float(typingctx, bits):
    """float16 bits (uint16) -> float32, exact."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _float_to_half_bits(typingctx, value):
    """float32 -> float16 bits, rounded to nearest even (as torch converts)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(value), codegen


def load(a, i):
    """``a[i]`` as a float: float16 storage is passed as uint16 and bfloat16 as int16 (their bits)."""


def store(a, i, v):
    """``a[i] = v`` rounded to a's dtype (to nearest even for float16/bfloat16 bits, as torch rounds)."""


@overload(load)
def _load_impl(a, i):
    if a.dtype == types.uint16:
        return lambda a, i: _half_bits_to_float(a[i])
    if a.dtype == types.int16:
        return lambda a, i: np.uint32(np.uint64(np.uint16(a[i])) << np.uint64(16)).view(np.float32)
    return lambda a, i: a[i]


@overload(store)
def _store_impl(a, i, v):
    if a.dtype == types.uint16:
        def store_half(a, i, v):
            a[i] = _float_to_half_bits(np.float32(v))
        return store_half
    if a.dtype == types.int16:
        def store_bfloat(a, i, v):
            u = np.int64(np.float32(v).view(np.uint32))
            a[i] = 0x7FC0 if v != v else (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return store_bfloat
    def store(a, i, v):
        a[i] = v
    return store


def transpose(src, src_at, src_stride, rows, cols, dst, dst_at, dst_stride):
    """``dst[dst_at + j*dst_stride + i] = src[src_at + i*src_stride + j]`` for i < rows, j < cols."""


@njit(error_model="numpy")
def _transpose_scalar(src, src_at, src_stride, rows, cols, dst, dst_at, dst_stride):
    for i in range(rows):
        for j in range(cols):
            store(dst, dst_at + j * dst_stride + i, load(src, src_at + i * src_stride + j))


@overload(transpose)
def _transpose_impl(src, src_at, src_stride, rows, cols, dst, dst_at, dst_stride):
    floats = (types.float32, types.float64)
    scalar = _transpose_scalar
    if src.dtype not in floats or dst.dtype not in floats:
        return lambda src, src_at, src_stride, rows, cols, dst, dst_at, dst_stride: scalar(
            src, src_at, src_stride, rows, cols, dst, dst_at, dst_stride)

    def blocked(src, src_at, src_stride, rows, cols, dst, dst_at, dst_stride):
        # 8 x 8 register transposes; the last block of an axis overlaps the one before (no remainder loop)
        if rows < _LANES or cols < _LANES:
            scalar(src, src_at, src_stride, rows, cols, dst, dst_at, dst_stride)
            return
        for i in range(0, rows, _LANES):
            i0 = min(i, rows - _LANES)
            for j in range(0, cols, _LANES):
                j0 = min(j, cols - _LANES)
                transpose8(src, src_at + i0 * src_stride + j0, src_stride, dst, dst_at + j0 * dst_stride + i0,
                           dst_stride)
    return blocked
