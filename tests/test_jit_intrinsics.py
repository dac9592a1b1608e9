"""The numba helpers of ``_core/jit_intrinsics.py``: the register transpose, the prefetches, the whole-line
streaming store and the compile switches."""
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
def test_compile_switches_apply_to_one_compilation_and_are_restored():
    import numba

    from cvops._core.jit_intrinsics import compile_scalar, compile_slp

    def add_into(a, b):
        for i in range(a.shape[0]):
            a[i] += b[i]

    a, b = np.arange(20.0), np.ones(20)
    signature = (numba.typeof(a), numba.typeof(b))
    before = (numba.config.LOOP_VECTORIZE, numba.config.SLP_VECTORIZE)
    for compile_with in (compile_scalar, compile_slp):
        kernel = numba.njit(add_into)
        compile_with(kernel, signature)
        assert len(kernel.signatures) == 1
        compile_with(kernel, signature)  # already compiled: nothing new
        assert len(kernel.signatures) == 1
        assert (numba.config.LOOP_VECTORIZE, numba.config.SLP_VECTORIZE) == before
        out = a.copy()
        kernel(out, b)
        np.testing.assert_array_equal(out, a + 1)
