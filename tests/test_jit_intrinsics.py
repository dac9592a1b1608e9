"""The numba helpers of ``_core/jit_intrinsics.py``: the register transpose, the prefetches, the whole-line
streaming store, the 8-lane sums and the scalar load."""
import re

import numpy as np
import pytest

from tests.conftest import requires_numba


@requires_numba
@pytest.mark.parametrize("src_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dst_dtype", [np.float32, np.float64])
def test_transpose8_moves_one_block_and_nothing_else(src_dtype, dst_dtype):
    import numba

    from cvops._core.jit_intrinsics import transpose8

    @numba.njit
    def run(src, src_at, src_stride, dst, dst_at, dst_stride):
        transpose8(src, src_at, src_stride, dst, dst_at, dst_stride)

    rng = np.random.default_rng(0)
    src = rng.standard_normal(200).astype(src_dtype)
    src[3 + 2 * 17 + 5] = np.nan  # values move as they are, NaN included
    dst = np.full(300, -7.0, dst_dtype)
    run(src, 3, 17, dst, 5, 11)
    block = src[3:3 + 8 * 17].reshape(8, 17)[:, :8]  # rows r, columns j
    written = np.zeros(300, bool)
    for j in range(8):
        np.testing.assert_array_equal(dst[5 + j * 11:5 + j * 11 + 8], block[:, j].astype(dst_dtype))
        written[5 + j * 11:5 + j * 11 + 8] = True
    assert (dst[~written] == -7.0).all()


@requires_numba
@pytest.mark.parametrize("dtype", [np.int16, np.float32, np.int64])
def test_stream_line_copies_one_aligned_line_and_nothing_else(dtype):
    import numba

    from cvops._core.jit_intrinsics import stream_line, store_fence

    @numba.njit
    def run(dst, dst_at, src, src_at):
        stream_line(dst, dst_at, src, src_at)
        store_fence()

    lanes = 64 // np.dtype(dtype).itemsize
    raw = np.full(8 * lanes, -7, dtype)
    first = (-(raw.ctypes.data % 64) // raw.itemsize) % lanes  # first element on a line boundary
    src = np.arange(1, 3 * lanes + 1).astype(dtype)
    run(raw, first + 2 * lanes, src, 5)  # source unaligned
    expected = np.full(8 * lanes, -7, dtype)
    expected[first + 2 * lanes:first + 3 * lanes] = src[5:5 + lanes]
    np.testing.assert_array_equal(raw, expected)


@requires_numba
def test_prefetches_compile_into_a_kernel_and_change_nothing():
    import numba

    from cvops._core.jit_intrinsics import STREAMING, prefetch, prefetch_l2

    @numba.njit
    def run(a):
        for i in range(0, a.size + 64, 16):  # past the end too: prefetches never fault
            prefetch(a, i)
            prefetch_l2(a, i)
        return a.sum()

    a = np.arange(100, dtype=np.float32)
    assert run(a) == np.arange(100, dtype=np.float32).sum()
    if STREAMING:  # x86-64: one hint into L1, one into L2
        asm = run.inspect_asm(run.signatures[0])
        assert "prefetcht0" in asm and "prefetcht1" in asm


@requires_numba
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lanes8_sum_eight_lanes_exactly_as_scalar_additions(dtype):
    import numba

    from cvops._core.jit_intrinsics import add8, load8, store8, zero8

    @numba.njit
    def run(src, dst, at, rows, step):
        acc = zero8(dst)
        for r in range(rows):
            acc = add8(acc, load8(src, np.uint64(r * step + at)))
        store8(dst, 3, add8(acc, load8(dst, 3)))

    rng = np.random.default_rng(0)
    src = rng.standard_normal(400).astype(dtype)
    src[5 + 2 * 40 + 3] = np.inf  # one lane overflows, the others do not notice
    dst = np.full(16, -7.0, dtype)
    dst[3:11] = rng.standard_normal(8)
    expected = dst.copy()
    acc = np.zeros(8, dtype)
    for r in range(9):  # the same additions in the same order, lane by lane
        acc = acc + src[r * 40 + 5:r * 40 + 13]
    expected[3:11] = acc + expected[3:11]
    run(src, dst, 5, 9, 40)
    np.testing.assert_array_equal(dst, expected)


@requires_numba
@pytest.mark.parametrize("dtype", [np.float32, np.int16, np.int64])
def test_scalar_load_keeps_a_loop_scalar_unrolled_and_changes_nothing(dtype):
    import numba

    from cvops._core.jit_intrinsics import scalar_load

    @numba.njit
    def plain(dst, src):
        for i in range(dst.shape[0]):
            dst[i] = src[i]

    @numba.njit
    def scalar(dst, src):
        for i in range(dst.shape[0]):
            dst[i] = scalar_load(src, i)

    src = np.arange(100).astype(dtype)
    for kernel in (plain, scalar):
        dst = np.zeros(100, dtype)
        kernel(dst, src)
        np.testing.assert_array_equal(dst, src)
    ir = {kernel: kernel.inspect_llvm(kernel.signatures[0]) for kernel in (plain, scalar)}
    vector = r"<\d+ x (float|i16|i64)>"  # LLVM's vector types in the optimised IR
    assert re.search(vector, ir[plain]) and not re.search(vector, ir[scalar])
    # still unrolled: a main loop of several loads and a remainder loop, not one load a trip
    assert len(re.findall(r"load atomic", ir[scalar])) > 2


@requires_numba
@pytest.mark.parametrize("name,bad", [
    ("load8", np.zeros(8, np.int32)),  # integers: no Lanes8
    ("load8", np.zeros((2, 8), np.float32)),  # 1-D arrays only
    ("scalar_load", np.zeros((2, 8), np.float32)),  # 1-D arrays only
    ("scalar_load", np.zeros(8, np.bool_)),  # integers and floats only
])
def test_intrinsics_reject_what_they_cannot_read(name, bad):
    import numba

    from cvops._core import jit_intrinsics

    intrinsic = getattr(jit_intrinsics, name)

    @numba.njit
    def run(a):
        return intrinsic(a, 0)

    with pytest.raises(numba.errors.TypingError):
        run(bad)
