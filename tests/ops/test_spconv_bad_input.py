"""Sparse convolution on bad input: every case raises ``BadParamError`` before any kernel runs, on the
numba and the torch path (``cpu_path`` fixture), never reads out of bounds or wraps silently."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import cvops
from cvops import sparse
from cvops._core.errors import BadParamError
from tests.ops._sparse_kmap import random_sparse


def test_features_reassigned_to_fewer_rows_rejected(cpu_path):
    # `x.features = ...` with fewer rows than x.indices: the map's input rows would index past the array
    torch.manual_seed(0)
    x = random_sparse(2, (6, 7, 8), 60, 4, dtype=torch.float32, seed=3)
    x.features = x.features[:-5].clone()
    for layer in (sparse.SparseConv3d(4, 5, 3, 2, 1), sparse.SubMConv3d(4, 5, 3, padding=1)):
        with pytest.raises(BadParamError, match="features rows"):
            layer(x)


def test_inverse_conv_rejects_features_not_matching_its_sites(cpu_path):
    x = random_sparse(2, (6, 7, 8), 60, 4, dtype=torch.float32, seed=4)
    down = sparse.SparseConv3d(4, 4, 3, 2, 1, indice_key="d")
    up = sparse.SparseInverseConv3d(4, 4, 3, indice_key="d")
    y = down(x)
    y.features = y.features[:-1]
    with pytest.raises(BadParamError, match="features rows"):
        up(y)


def test_indice_conv_has_no_public_value_check_switch():
    x = random_sparse(1, (4, 4, 4), 10, 2, dtype=torch.float32, seed=5)
    _, pairs, num = cvops.get_indice_pairs(x.indices, 1, [4, 4, 4], 3, 1, 1, 1)
    with pytest.raises(TypeError):
        sparse.indice_conv(x.features, torch.zeros(27, 2, 3), pairs, num, 10, check_values=False)


def test_indice_conv_out_of_range_pair_rejected(cpu_path):
    x = random_sparse(1, (4, 4, 4), 10, 2, dtype=torch.float32, seed=5)
    _, pairs, num = cvops.get_indice_pairs(x.indices, 1, [4, 4, 4], 3, 1, 1, 1)
    bad = pairs.clone()
    bad[13, 0, 0] = 1 << 30
    with pytest.raises(BadParamError, match="indice_pairs"):
        sparse.indice_conv(x.features, torch.zeros(27, 2, 3), bad, num, int(pairs[:, 1].max()) + 1)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("col", [0, 1])
def test_compiled_layer_is_bounds_safe(direction, col):
    # the compiled layer checks every row index itself (and that a destination row lies in its block): an
    # out-of-range row in either column raises, never reads or writes
    pytest.importorskip("numba")
    from cvops.sparse import cpu_numba
    f, w, g = torch.randn(8, 4), torch.randn(1, 4, 4), torch.randn(8, 4)
    bounds = torch.tensor([[0, 3]], dtype=torch.int64)  # one offset, one block, pairs 0:3
    for bad in (1 << 28, -3):
        pairs = torch.tensor([[[0, 1, 2], [0, 1, 2]]], dtype=torch.int32)
        pairs[0, col, 2] = bad
        out, grad_f, grad_w = torch.zeros(8, 4), torch.zeros(8, 4), torch.zeros(1, 4, 4)
        with pytest.raises(BadParamError, match="row index"):
            if direction == "forward":
                cpu_numba.conv_forward(out, f, w, pairs, bounds, np.array([0]), -1, 0, 1, 8, 4)
            else:
                cpu_numba.conv_backward(grad_f, grad_w, g, f, w, pairs, bounds, np.array([0]), -1, 0, 1, 8, 4)
        assert torch.equal(out[3:], torch.zeros(5, 4)) and torch.equal(grad_f[3:], torch.zeros(5, 4))


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("args", [
    ([[0, 2 ** 40 - 1]], 1, [2 ** 40]),            # coordinate beyond int32
    ([[0, 2 ** 32 + 5]], 1, [2 ** 33]),            # would wrap to 5
    ([[2 ** 31, 0]], 2 ** 31 + 1, [4]),             # batch index beyond int32
])
def test_get_indice_pairs_rejects_values_beyond_int32(args, backend):
    indices, batch, shape = args
    with pytest.raises(BadParamError, match=r"int32"):
        cvops.get_indice_pairs(torch.tensor(indices, dtype=torch.int64), batch, shape, 3, 2, 1,
                               backend=backend)
    with pytest.raises(BadParamError, match=r"int32"):
        cvops.get_indice_pairs(torch.tensor(indices, dtype=torch.int64), batch, shape, 1, 1, 0, subm=True,
                               backend=backend)


@pytest.mark.parametrize("row", [(0, 1, -1, 2), (-1, 1, 1, 2), (0, 1, 8, 2), (2, 0, 0, 0)])
def test_dense_rejects_sites_outside_the_grid(row):
    indices = torch.tensor([[0, 0, 0, 0], list(row)], dtype=torch.int32)
    x = sparse.SparseConvTensor(torch.ones(2, 3), indices, [4, 8, 4], 2)
    with pytest.raises(BadParamError, match="dense"):
        x.dense()


def test_conv_output_size_non_positive_raises():
    with pytest.raises(BadParamError, match="output spatial shape"):
        cvops.get_conv_output_size([4] * 3, 7, 1, 0, 1)
    with pytest.raises(BadParamError, match="output spatial shape"):
        cvops.get_deconv_output_size([1], 1, 1, 1, 1)
    assert cvops.get_conv_output_size([4] * 3, 3, 1, 0, 1) == [2, 2, 2]
