"""The compiled strided kernel map (``strided_numba``: an occupancy bitmap of the output grid instead of a
sort) is the torch path's map bit for bit -- out_indices, indice_pairs and indice_num -- on drawn geometries
of every rank, regular and transposed, and on KITTI-scale LiDAR-like sets; the numba backend takes it only
where its memory rule allows."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cvops
from cvops._core import jit
from cvops.ops.get_indice_pairs import cpu
from cvops.ops.get_indice_pairs.checks import check_params
from tests.support.inputs.get_indice_pairs import lidar_voxels, uniform_voxels

pytestmark = pytest.mark.skipif(not jit.numba_available(), reason="numba not installed")


def strided():
    from cvops.ops.get_indice_pairs import strided_numba
    return strided_numba


def assert_same(actual, expected):
    for name, a, e in zip(("out_indices", "indice_pairs", "indice_num"), actual, expected):
        assert a.dtype == e.dtype == torch.int32, name
        assert a.shape == e.shape, (name, a.shape, e.shape)
        assert torch.equal(a, e), name


def both_maps(indices, batch_size, shape, **kw):
    """(bitmap map, torch map) of one geometry, the bitmap path called directly whatever its memory rule."""
    geo = check_params(indices, batch_size, shape, kw.get("kernel_size", 3), kw.get("stride", 1),
                       kw.get("padding", 0), kw.get("dilation", 1), kw.get("out_padding", 0),
                       transpose=kw.get("transpose", False))
    return strided().strided_pairs(indices, geo), cpu.get_indice_pairs(indices, geo)


@st.composite
def geometries(draw):
    ndim, batch = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 9)) for _ in range(ndim)]
    L = draw(st.integers(1, min(batch * int(np.prod(shape)), 60)))
    idx = uniform_voxels(L, batch, shape, seed=draw(st.integers(0, 999)))
    if draw(st.booleans()):  # repeated rows are legal for a regular or transposed conv
        idx = torch.cat([idx, idx[: draw(st.integers(0, L))]])
    transpose = draw(st.booleans())
    k = [draw(st.integers(1, 4)) for _ in range(ndim)]
    s = [draw(st.integers(1, 3)) for _ in range(ndim)]
    d = [draw(st.integers(1, 3)) if s[i] == 1 else 1 for i in range(ndim)]
    p = [draw(st.integers(0, 3)) for _ in range(ndim)]
    op = [draw(st.integers(0, 1)) for _ in range(ndim)]
    return idx, batch, shape, dict(kernel_size=k, stride=s, padding=p, dilation=d, out_padding=op,
                                   transpose=transpose)


@settings(max_examples=150, deadline=None, database=None)
@given(case=geometries(), dtype=st.sampled_from([torch.int32, torch.int64]))
def test_bitmap_map_equals_torch_map(case, dtype):
    idx, batch, shape, kw = case
    try:
        bitmap, expected = both_maps(idx.to(dtype), batch, shape, **kw)
    except cvops.BadParamError:  # an empty output grid: nothing to compare
        return
    assert_same(bitmap, expected)


def test_bitmap_map_equals_reference_on_word_edges():
    """1-D sites whose output keys sit at every bit of a word, the sign bit (63) included, and across words."""
    idx = torch.tensor([[0, x] for x in (0, 1, 62, 63, 64, 65, 126, 127, 128, 190, 191)] + [[1, 63], [1, 64]],
                       dtype=torch.int32)
    for kw in (dict(kernel_size=1), dict(kernel_size=3, padding=1), dict(kernel_size=3, stride=2, padding=1),
               dict(kernel_size=2, stride=2, transpose=True)):
        bitmap, expected = both_maps(idx, 2, [192], **kw)
        assert_same(bitmap, expected)
        reference = cvops.get_indice_pairs(idx, 2, [192], backend="reference", **kw)
        assert_same(bitmap, reference)


def test_popcount_matches_bin_count():
    values = [0, 1, -1, 2**62, -2**63, -2**63 + 1, 0x5555555555555555, -0x5555555555555556, 2**63 - 1]
    values += np.random.default_rng(0).integers(-2**63, 2**63 - 1, 200, dtype=np.int64).tolist()
    popcount = strided()._popcount
    count = __import__("numba").njit(lambda v: popcount(v))
    for v in values:
        assert count(np.int64(v)) == bin(v & (2**64 - 1)).count("1"), v


KITTI = [41, 1600, 1408]
# VoxelBackBone8x's downsampling layers, each on the previous one's output
LAYERS = [dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=3, stride=2, padding=1),
          dict(kernel_size=3, stride=2, padding=[0, 1, 1]), dict(kernel_size=[3, 1, 1], stride=[2, 1, 1], padding=0)]


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_kitti_backbone_maps_equal_torch_maps(threads):
    """The four strided maps of a KITTI-scale backbone (16k LiDAR-like voxels a frame, batch 2), on one thread
    and shared over two (the later layers are large enough to use the pool), through the numba backend."""
    idx, shape = lidar_voxels(32000, 2, KITTI, seed=0), KITTI
    before = torch.get_num_threads()
    try:
        for kw in LAYERS:
            torch.set_num_threads(1)
            expected = cvops.get_indice_pairs(idx, 2, shape, backend="torch", **kw)
            torch.set_num_threads(threads)
            geo = check_params(idx, 2, shape, kw["kernel_size"], kw["stride"], kw["padding"], 1)
            assert strided().bitmap_sizes(idx, geo) is not None
            assert_same(cvops.get_indice_pairs(idx, 2, shape, backend="numba", **kw), expected)
            idx, shape = expected[0], cvops.get_conv_output_size(shape, kw["kernel_size"], kw["stride"],
                                                                 kw["padding"], 1)
    finally:
        torch.set_num_threads(before)


def test_memory_rule_picks_the_path(monkeypatch):
    """Bitmap where bits + prefix + tap tables fit in the sort's 8 * L * K bytes of keys, else the torch code;
    the bitmap spans the batches present (largest index + 1), not ``batch_size``."""
    module = strided()
    calls = []
    monkeypatch.setattr(module, "strided_pairs", lambda i, g, s: calls.append(g) or cpu.get_indice_pairs(i, g))
    dense = uniform_voxels(500, 2, [20, 30, 40], seed=1)
    cvops.get_indice_pairs(dense, 4096, [20, 30, 40], 3, 2, 1, backend="numba")
    assert len(calls) == 1
    sparse = uniform_voxels(20, 1, [500, 500, 500], seed=1)  # 16 M output cells for 540 slots
    expected = cvops.get_indice_pairs(sparse, 1, [500, 500, 500], 3, 2, 1, backend="torch")
    assert_same(cvops.get_indice_pairs(sparse, 1, [500, 500, 500], 3, 2, 1, backend="numba"), expected)
    assert len(calls) == 1
    subm = cvops.get_indice_pairs(dense, 2, [20, 30, 40], 3, 1, 1, subm=True, backend="numba")
    assert len(calls) == 1 and subm[2].sum() > 0
