"""cvops.spconv: spconv.pytorch 2.x's names and conventions, each new layer against a dense torch computation
(transposed conv, max / avg pool, global pools), indice_key rules, SparseConvTensor API, checkpoints."""
from __future__ import annotations

import importlib
import inspect
import math
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cvops.spconv as spconv
from cvops import sparse
from cvops._core.errors import BadParamError, NotSupportedError
from tests.ops._sparse_kmap import random_sparse
from tests.support.anchors import spconv_pytorch


def _sp(x):
    return spconv.SparseConvTensor(x.features, x.indices, x.spatial_shape, x.batch_size)


def _dense_with(x, feats, fill):
    """``[B, C, *spatial]`` with ``feats`` at the sites of ``x`` and ``fill`` elsewhere (differentiable)."""
    c = feats.shape[1]
    out = feats.new_full((x.batch_size, *x.spatial_shape, c), fill)
    out = out.index_put(tuple(col.long() for col in x.indices.t()), feats)
    return out.movedim(-1, 1)


def _rows(dense, y):
    """The rows of ``dense [B, C, *spatial]`` at the sites of ``y`` (in ``y``'s order)."""
    return dense.movedim(1, -1)[tuple(col.long() for col in y.indices.t())]


def _sites(mask, y):
    """``y``'s sites equal the positions where ``mask [B, 1, *spatial]`` is non-zero (as sets)."""
    expected = torch.nonzero(mask[:, 0] > 0).tolist()
    assert sorted(map(tuple, y.indices.tolist())) == sorted(map(tuple, expected))


# ----------------------------------------------------------------------------- names and signatures
def test_spconv_names_and_module_paths():
    for n in (1, 2, 3, 4):
        for kind in ("SparseConv", "SubMConv", "SparseConvTranspose", "SparseInverseConv"):
            cls = getattr(spconv, f"{kind}{n}d")
            assert issubclass(cls, spconv.conv.SparseConvolution) and cls is getattr(sparse, f"{kind}{n}d")
    assert spconv.conv.SparseConvolution is sparse.SparseConvolution
    for name in ("SparseMaxPool1d", "SparseMaxPool4d", "SparseAvgPool3d", "SparseGlobalMaxPool", "SparseGlobalAvgPool",
                 "ToDense", "RemoveGrid", "SparseIdentity", "SparseSequential", "SparseModule", "SparseConvTensor",
                 "AddTable", "ConcatTable", "JoinTable", "Identity", "ConvAlgo", "SparseBatchNorm", "SparseReLU"):
        assert hasattr(spconv, name), name
    assert spconv.pool.SparseMaxPool3d is spconv.SparseMaxPool3d
    assert callable(spconv.functional.indice_conv) and callable(spconv.ops.get_conv_output_size)
    sig = inspect.signature(spconv.SparseConv3d.__init__).parameters
    for arg in ("indice_key", "algo", "fp32_accum", "record_voxel_count", "large_kernel_fast_algo", "name"):
        assert arg in sig
    assert list(inspect.signature(spconv.SparseInverseConv3d.__init__).parameters)[1:5] == [
        "in_channels", "out_channels", "kernel_size", "indice_key"]


def test_spconv_constructor_arguments_accepted():
    layer = spconv.SubMConv3d(4, 8, 3, algo=spconv.ConvAlgo.Native, fp32_accum=True, large_kernel_fast_algo=True,
                              name="sub", indice_key="k")
    assert layer.name == "sub" and layer.weight.shape == (8, 3, 3, 3, 4)
    down = spconv.SparseConv3d(4, 8, 3, 2, 1, record_voxel_count=True)
    x = random_sparse(2, (6, 7, 8), 50, 4, dtype=torch.float32, seed=1)
    y = down(_sp(x))
    assert int(down.get_max_num_voxels()) == y.indices.shape[0]
    with pytest.raises(NotSupportedError, match="act_type"):
        spconv.conv.SparseConvolution(3, 4, 4, act_type="ReLU")


# ----------------------------------------------------------------------------- SubM and indice_key
def test_subm_centres_the_kernel_and_ignores_padding():
    x = _sp(random_sparse(2, (6, 7, 8), 60, 3, dtype=torch.float64, seed=2))
    torch.manual_seed(0)
    a = spconv.SubMConv3d(3, 4, 3, padding=1, dilation=2).double()
    b = spconv.SubMConv3d(3, 4, 3, padding=0, dilation=2).double()
    b.load_state_dict(a.state_dict())
    ya, yb = a(x), b(x)
    assert torch.equal(ya.features, yb.features) and torch.equal(ya.indices, x.indices)
    # against the dense convolution with the centred padding d * (k // 2) = 2
    w = sparse.convert_weight(a.weight, "spconv", "torch")
    ref = F.conv3d(x.dense(), w, a.bias, 1, 2, 2)
    torch.testing.assert_close(ya.features, _rows(ref, ya), atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("cls", ["SubMConv3d", "SparseConv3d"])
def test_the_backward_keeps_the_weight_itself_not_a_copy(cls):
    """A layer's [out, *k, in] weight reaches the convolution as a permuted view: what its backward keeps is
    that view of the parameter, so a network holds no second copy of its weights between forward and
    backward. Its gradient is still the dense convolution's."""
    x = _sp(random_sparse(2, (6, 7, 8), 60, 3, dtype=torch.float64, seed=2))
    layer = getattr(spconv, cls)(3, 4, 3, padding=1, bias=False).double()
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        y = layer(x)
    weights = [t for t in kept if t.dtype == torch.float64 and t.shape == (27, 3, 4)]
    assert weights and all(t.untyped_storage().data_ptr() == layer.weight.untyped_storage().data_ptr()
                           for t in weights)
    y.features.sum().backward()
    w = sparse.convert_weight(layer.weight.detach(), "spconv", "torch").requires_grad_()
    dense = F.conv3d(x.dense(), w, None, 1, 1)
    _rows(dense, y).sum().backward()
    torch.testing.assert_close(layer.weight.grad, sparse.convert_weight(w.grad, "torch", "spconv"),
                               atol=1e-10, rtol=1e-9)


def test_a_strided_map_is_kept_compact_and_serves_its_inverse():
    """A strided layer keeps its map with as many slots per offset as the fullest offset fills (the op's map
    has one per input site): the same pairs, and the conv and its inverse give the results of the full map."""
    x = _sp(random_sparse(2, (12, 14, 16), 300, 3, dtype=torch.float64, seed=4))
    down = spconv.SparseConv3d(3, 5, 3, 2, 1, indice_key="d").double()
    up = spconv.SparseInverseConv3d(5, 3, 3, "d").double()
    y = down(x)
    z = up(y)
    data = y.indice_dict["d"]
    _, full, num = sparse.get_indice_pairs_nd(x.indices, 2, x.spatial_shape, (3, 3, 3), (2, 2, 2), (1, 1, 1),
                                              (1, 1, 1), False, False, 0)
    assert full.shape[2] == x.indices.shape[0] > data.indice_pairs.shape[2] == int(num.max())
    assert torch.equal(data.indice_pairs, full[:, :, :int(num.max())]) and torch.equal(data.indice_num, num)
    w_down, w_up = down.kernel_weight(), up.kernel_weight()
    want_y = sparse.indice_conv(x.features, w_down, full, num, y.indices.shape[0]) + down.bias
    want_z = sparse.indice_conv(want_y, w_up, full, num, x.indices.shape[0], inverse=True) + up.bias
    torch.testing.assert_close(y.features, want_y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(z.features, want_z, rtol=1e-12, atol=1e-12)


def test_indice_key_reuse_rules():
    x = _sp(random_sparse(2, (6, 7, 8), 60, 4, dtype=torch.float32, seed=3))
    # the backbone pattern: padding=1 then default padding under one key
    net = spconv.SparseSequential(spconv.SubMConv3d(4, 4, 3, padding=1, indice_key="subm1"),
                                  spconv.SubMConv3d(4, 4, 3, indice_key="subm1"))
    y = net(x)
    first = y.indice_dict["subm1"]
    assert first.is_subm and first.ksize == [3, 3, 3] and first.indice_pair_num is first.indice_num
    fresh = spconv.SubMConv3d(4, 4, 3)
    fresh.load_state_dict(net[1].state_dict())
    torch.testing.assert_close(y.features, fresh(net[0](x)).features)
    with pytest.raises(ValueError, match="same dilation"):
        spconv.SubMConv3d(4, 4, 3, dilation=2, indice_key="subm1")(y)
    with pytest.raises(ValueError, match="same kernel size"):
        spconv.SubMConv3d(4, 4, 5, indice_key="subm1")(y)
    down = spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="d")(y)
    with pytest.raises(BadParamError, match="holds a sparse conv map"):
        spconv.SubMConv3d(4, 4, 3, indice_key="d")(down)
    assert "d" not in y.indice_dict  # the conv wrote its map into its output's copy of the dict
    beside = spconv.SparseConvTensor(y.features, y.indices, y.spatial_shape, y.batch_size,
                                     indice_dict=down.indice_dict)  # carries "d", on y's sites
    with pytest.raises(BadParamError, match="must be the output of the conv"):
        spconv.SparseInverseConv3d(4, 4, 3, "d")(beside)


def _other_sites(x, seed):
    """A tensor on as many sites of the same grid as ``x``, but other ones (other features too)."""
    y = random_sparse(x.batch_size, tuple(x.spatial_shape), x.indices.shape[0], x.features.shape[1],
                      dtype=x.features.dtype, seed=seed)
    assert not torch.equal(y.indices, x.indices)
    return y


@pytest.mark.parametrize("reorder", [False, True], ids=["other-sites", "same-sites-other-order"])
def test_subm_key_on_tensors_sharing_one_indice_dict_gives_fresh_results(reorder, cpu_path):
    # issue 33: two tensors constructed with one indice_dict (spconv's constructor argument); the first layer
    # call wrote its map into that dict and the second, on other sites or the same sites in another row order,
    # ran the stale map (output rows in the old order, features gathered through the old rows). spconv 2.3.8
    # copies the dict per layer, so the second call builds its own map.
    a = random_sparse(2, (6, 7, 8), 60, 3, seed=31)
    if reorder:
        perm = torch.randperm(60, generator=torch.Generator().manual_seed(1))
        b = sparse.SparseConvTensor(a.features[perm], a.indices[perm], a.spatial_shape, 2)
    else:
        b = _other_sites(a, 32)
    shared = {}
    a = spconv.SparseConvTensor(a.features, a.indices, a.spatial_shape, 2, indice_dict=shared)
    b = spconv.SparseConvTensor(b.features, b.indices, b.spatial_shape, 2, indice_dict=shared)
    keyed = spconv.SubMConv3d(3, 4, 3, indice_key="s").double()
    fresh = spconv.SubMConv3d(3, 4, 3).double()
    fresh.load_state_dict(keyed.state_dict())
    ya, yb = keyed(a), keyed(b)
    assert shared == {} and "s" in ya.indice_dict and ya.indice_dict is not shared
    for x, y in ((a, ya), (b, yb)):
        expected = fresh(x)
        assert torch.equal(y.indices, x.indices) and torch.equal(y.indices, expected.indices)
        torch.testing.assert_close(y.features, expected.features, rtol=0, atol=0)


def test_reused_kernel_map_must_be_on_the_very_same_sites(cpu_path):
    x = _sp(random_sparse(2, (6, 7, 8), 60, 3, seed=33))
    layer = spconv.SubMConv3d(3, 3, 3, indice_key="s").double()
    y = layer(x)
    # an equal copy of the sites (not the same tensor) reuses the map and gives the same result
    same = spconv.SparseConvTensor(y.features, y.indices.clone(), y.spatial_shape, 2, indice_dict=y.indice_dict)
    assert torch.equal(layer(same).features, layer(y).features)
    perm = torch.randperm(60, generator=torch.Generator().manual_seed(2))
    elsewhere = _other_sites(x, 34)
    for indices, features in ((y.indices[perm], y.features[perm]), (elsewhere.indices, elsewhere.features)):
        stale = spconv.SparseConvTensor(features, indices, y.spatial_shape, 2, indice_dict=y.indice_dict)
        with pytest.raises(BadParamError, match=r"indice_key='s' must see the same sites in the same row order"):
            layer(stale)
    # the inverse conv likewise: only on the very output sites of the conv it inverts
    down = spconv.SparseConv3d(3, 3, 3, 2, 1, indice_key="d").double()(x)
    perm = torch.randperm(down.indices.shape[0], generator=torch.Generator().manual_seed(3))
    shuffled = spconv.SparseConvTensor(down.features[perm], down.indices[perm], down.spatial_shape, 2,
                                       indice_dict=down.indice_dict)
    with pytest.raises(BadParamError, match=r"must be the output of the conv it inverts under indice_key='d'"):
        spconv.SparseInverseConv3d(3, 3, 3, "d").double()(shuffled)


@pytest.mark.parametrize("stride,padding,dilation,message", [
    (1, 1, 1, "same stride and padding"), (2, 0, 1, "same stride and padding"), (1, 2, 2, "same dilation")])
def test_sparse_conv_key_reuse_needs_the_same_geometry(stride, padding, dilation, message, cpu_path):
    # a sparse conv meeting a map cached under its key with another stride, padding or dilation must not run
    # that map: a U-Net that encodes again after an inverse conv brings the key back to the same sites
    x = _sp(random_sparse(2, (6, 7, 8), 60, 3, seed=35))
    down = spconv.SparseConv3d(3, 3, 3, 2, 1, indice_key="d").double()
    back = spconv.SparseInverseConv3d(3, 3, 3, "d").double()(down(x))  # x's sites, "d" cached
    again = spconv.SparseConv3d(3, 3, 3, 2, 1, indice_key="d").double()
    again.load_state_dict(down.state_dict())
    y = again(back)  # same geometry and sites: the cached map, the fresh result
    assert y.indice_dict["d"] is back.indice_dict["d"]
    fresh = spconv.SparseConv3d(3, 3, 3, 2, 1).double()
    fresh.load_state_dict(down.state_dict())
    torch.testing.assert_close(y.features, fresh(back).features, rtol=0, atol=0)
    other = spconv.SparseConv3d(3, 3, 3, stride, padding, dilation, indice_key="d").double()
    with pytest.raises(BadParamError, match=f"indice_key='d' must have the {message}"):
        other(back)


# ----------------------------------------------------------------------------- SparseConvTensor API
def test_sparse_conv_tensor_spconv_api():
    x = random_sparse(2, (5, 6, 7), 30, 3, dtype=torch.float32, seed=4)
    t = spconv.SparseConvTensor(x.features, x.indices, np.array([5, 6, 7]), np.int64(2))
    assert t.spatial_shape == [5, 6, 7] and t.batch_size == 2 and type(t.batch_size) is int
    import cvops
    for a, b in zip(cvops.get_indice_pairs(x.indices, 2, np.array([5, 6, 7]), 3, 2, 1),
                    cvops.get_indice_pairs(x.indices, 2, [5, 6, 7], 3, 2, 1)):
        assert torch.equal(a, b)
    u = t.replace_feature(feature=t.features * 2)
    assert torch.equal(u.features, x.features * 2) and u.indice_dict is t.indice_dict
    with pytest.raises(BadParamError, match="feature rows"):
        t.replace_feature(t.features[:3])
    d = t.dense(channels_first=False)
    back = spconv.SparseConvTensor.from_dense(d)
    assert back.spatial_shape == [5, 6, 7] and back.batch_size == 2
    assert torch.equal(back.dense(), t.dense())
    assert torch.equal((t + t).features, 2 * t.features) and torch.equal(t.minus().features, -t.features)
    seq = spconv.SparseSequential()
    seq.add(spconv.SubMConv3d(3, 4, 3))
    seq.add(torch.nn.ReLU(), "relu")
    seq.add(spconv.ToDense())
    assert list(seq._modules) == ["0", "relu", "2"] and seq(t).shape == (2, 4, 5, 6, 7)
    assert spconv.RemoveGrid()(t).grid is None and spconv.SparseIdentity()(t) is t


@pytest.mark.parametrize("channels_first", [True, False])
def test_dense_sums_duplicate_sites_and_its_gradient_gathers_them(channels_first):
    """dense() against a plain loop (duplicate sites summed), gradcheck, and the same under torch.compile and
    torch.func.grad."""
    x = random_sparse(2, (3, 4, 5), 12, 3, dtype=torch.float64, seed=7)
    indices = torch.cat([x.indices, x.indices[:4]])  # four sites twice
    features = torch.randn(indices.shape[0], 3, dtype=torch.float64, requires_grad=True)

    def dense(f):
        return sparse.SparseConvTensor(f, indices, [3, 4, 5], 2).dense(channels_first)

    expected = torch.zeros(2, 3, 4, 5, 3, dtype=torch.float64)
    for row, (b, z, y, w) in zip(features.detach(), indices.tolist()):
        expected[b, z, y, w] += row
    got = dense(features)
    torch.testing.assert_close(got, expected.movedim(-1, 1) if channels_first else expected, rtol=0, atol=1e-15)
    assert got.is_contiguous()
    assert torch.autograd.gradcheck(dense, (features,))
    compiled = torch.compile(dense, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(features), got)
    grad = torch.randn(got.shape, dtype=torch.float64)
    expected_grad = torch.autograd.grad(got, features, grad)[0]
    torch.testing.assert_close(torch.autograd.grad(compiled(features), features, grad)[0], expected_grad)
    torch.testing.assert_close(torch.func.grad(lambda f: (dense(f) * grad).sum())(features.detach()), expected_grad)


# ----------------------------------------------------------------------------- new layers vs dense torch
@pytest.mark.parametrize("kernel,stride,padding,output_padding", [(3, 2, 1, 0), (2, 2, 0, 0), (3, 1, 1, 0),
                                                                  ((3, 2, 3), (2, 1, 2), (1, 0, 1), 0)])
def test_transposed_conv_matches_dense(kernel, stride, padding, output_padding):
    x = _sp(random_sparse(2, (4, 5, 3), 25, 3, dtype=torch.float64, seed=5))
    layer = spconv.SparseConvTranspose3d(3, 4, kernel, stride, padding).double()
    feats = x.features.clone().requires_grad_()
    y = layer(x.replace_feature(feats))
    feats_ref = x.features.clone().requires_grad_()
    w_ref = layer.weight.detach().clone().requires_grad_()
    ref = F.conv_transpose3d(_dense_with(x, feats_ref, 0.0), w_ref.permute(4, 0, 1, 2, 3), None, layer.stride,
                             layer.padding)
    assert list(ref.shape[2:]) == y.spatial_shape
    reach = F.conv_transpose3d(_dense_with(x, torch.ones_like(feats_ref[:, :1]), 0.0),
                               torch.ones(1, 1, *layer.kernel_size, dtype=torch.float64), None, layer.stride,
                               layer.padding)
    _sites(reach, y)
    expected = _rows(ref, y) + layer.bias.detach()
    torch.testing.assert_close(y.features, expected.detach(), atol=1e-10, rtol=1e-9)
    g = torch.randn(y.features.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (y.features * g).sum().backward()
    (expected * g).sum().backward()
    torch.testing.assert_close(feats.grad, feats_ref.grad, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(layer.weight.grad, w_ref.grad, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("cls,kernel,stride,padding,dilation", [
    ("SparseMaxPool3d", 3, 2, 1, 1), ("SparseMaxPool3d", 2, None, 0, 1), ("SparseMaxPool3d", 3, 1, 1, 2),
    ("SparseAvgPool3d", 3, 2, 1, 1), ("SparseAvgPool3d", 2, None, 0, 1)])
def test_pools_match_dense(cls, kernel, stride, padding, dilation):
    x = _sp(random_sparse(2, (6, 7, 5), 70, 3, dtype=torch.float64, seed=6))
    pool = getattr(spconv, cls)(kernel, stride, padding, dilation)
    feats = x.features.clone().requires_grad_()
    y = pool(x.replace_feature(feats))
    s = pool.stride
    mask = F.max_pool3d(_dense_with(x, torch.ones_like(feats[:, :1]), 0.0), kernel, s, padding, dilation)
    _sites(mask, y)
    feats_ref = x.features.clone().requires_grad_()
    if cls.startswith("SparseMax"):  # inactive sites take no part: they are -inf, not 0
        ref = F.max_pool3d(_dense_with(x, feats_ref, -math.inf), kernel, s, padding, dilation)
        expected = _rows(ref, y)
    else:  # dilated avg_pool3d does not exist in torch: only dilation 1 here
        total = F.avg_pool3d(_dense_with(x, feats_ref, 0.0), kernel, s, padding, divisor_override=1)
        count = F.avg_pool3d(_dense_with(x, torch.ones_like(feats_ref[:, :1]), 0.0), kernel, s, padding,
                             divisor_override=1)
        expected = _rows(total, y) / _rows(count, y)
    assert list(mask.shape[2:]) == y.spatial_shape
    torch.testing.assert_close(y.features, expected.detach(), atol=1e-12, rtol=1e-12)
    g = torch.randn(y.features.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (y.features * g).sum().backward()
    (expected * g).sum().backward()
    torch.testing.assert_close(feats.grad, feats_ref.grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("mean", [False, True])
def test_global_pools_match_dense(mean):
    x = _sp(random_sparse(3, (4, 5, 6), 40, 5, dtype=torch.float64, seed=7))
    pool = spconv.SparseGlobalAvgPool() if mean else spconv.SparseGlobalMaxPool()
    out = pool(x)
    assert out.shape == (3, 5)
    for b in range(3):
        rows = x.features[x.indices[:, 0] == b]
        expected = rows.mean(0) if mean else rows.amax(0)
        torch.testing.assert_close(out[b], expected, atol=1e-12, rtol=1e-12)


def test_pool_kernel_map_is_reused_by_inverse_conv():
    x = _sp(random_sparse(2, (6, 6, 6), 50, 3, dtype=torch.float64, seed=8))
    y = spconv.SparseMaxPool3d(2, indice_key="p")(x)
    z = spconv.SparseInverseConv3d(3, 2, 2, "p").double()(y)
    assert torch.equal(z.indices, x.indices) and z.spatial_shape == x.spatial_shape


# ----------------------------------------------------------------------------- layouts
def test_mmcv_layout_classes_share_the_implementation():
    from cvops.mmcv import sparse as mmcv_sparse
    x = random_sparse(2, (5, 6, 7), 40, 3, dtype=torch.float64, seed=9)
    a = spconv.SparseConv3d(3, 4, 3, 2, 1).double()
    b = mmcv_sparse.SparseConv3d(3, 4, 3, 2, 1).double()
    assert b.weight.shape == (3, 3, 3, 3, 4)
    sparse.load_state_dict(b, a.state_dict(), "spconv")
    assert torch.equal(b.weight, sparse.convert_weight(a.weight, "spconv", "mmcv"))
    ya, yb = a(_sp(x)), b(x)
    assert torch.equal(ya.indices, yb.indices)
    torch.testing.assert_close(ya.features, yb.features, atol=1e-12, rtol=1e-12)
    sub = mmcv_sparse.SubMConv3d(3, 2, 3, indice_key="s").double()
    assert sub(x).features.shape == (40, 2)


# ----------------------------------------------------------------------------- against spconv itself
def test_transposed_conv_and_max_pool_match_spconv():
    spt = spconv_pytorch()
    if spt is None:
        pytest.skip("spconv not installed")
    x = random_sparse(2, (6, 7, 5), 70, 3, dtype=torch.float32, seed=6)
    threads = torch.get_num_threads()
    for make, feats in ((lambda lib: lib.SparseConvTranspose3d(3, 4, 3, 2, 1), x.features),
                        (lambda lib: lib.SparseMaxPool3d(3, 2, 1), x.features.abs()),
                        (lambda lib: lib.SparseMaxPool3d(2, 2), x.features.abs() + 0.1)):
        ref, layer = make(spt), make(spconv)
        layer.load_state_dict(ref.state_dict())
        fr, fc = feats.clone().requires_grad_(), feats.clone().requires_grad_()
        torch.set_num_threads(1)
        try:
            yr = ref(spt.SparseConvTensor(fr, x.indices, x.spatial_shape, 2)).dense()
            yr.sin().sum().backward()
        finally:
            torch.set_num_threads(threads)
        yc = layer(spconv.SparseConvTensor(fc, x.indices, x.spatial_shape, 2)).dense()
        yc.sin().sum().backward()
        torch.testing.assert_close(yc, yr, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fc.grad, fr.grad, atol=1e-5, rtol=1e-5)


@pytest.fixture
def spconv_modules():
    """Restores ``sys.modules``' spconv entries (the real spconv may be installed: the benchmarks' anchor)."""
    saved = {k: v for k, v in sys.modules.items() if k == "spconv" or k.startswith("spconv.")}
    yield
    for key in [k for k in sys.modules if k == "spconv" or k.startswith("spconv.")]:
        del sys.modules[key]
    sys.modules.update(saved)


def test_install_as_spconv_serves_code_that_imports_spconv(spconv_modules):
    """Code that imports spconv itself (OpenPCDet's spconv_utils, mmdet3d's version check and layer imports)
    gets cvops.spconv's modules and classes after install_as_spconv, and runs on them."""
    spconv.install_as_spconv()
    top = importlib.import_module("spconv")  # OpenPCDet's pcdet/utils/spconv_utils.py, from here on
    if float(top.__version__[2:]) >= 2.2:
        top.constants.SPCONV_USE_DIRECT_TABLE = False
    try:
        import spconv.pytorch as imported
    except ImportError:
        pytest.fail("import spconv.pytorch failed after install_as_spconv")
    assert imported is spconv and top.pytorch is spconv
    assert hasattr(top, "__version__") and top.__version__ >= "2.0.0"  # mmdet3d's IS_SPCONV2_AVAILABLE test
    from spconv.pytorch import SparseConvTensor, SparseModule, SparseSequential, SubMConv3d
    from spconv.pytorch.conv import SparseConvolution
    assert SubMConv3d is spconv.SubMConv3d and SparseConvolution is spconv.conv.SparseConvolution
    with pytest.raises(ImportError):
        importlib.import_module("spconv.utils")  # spconv's voxel generators are not part of cvops

    class Block(SparseModule):
        def __init__(self):
            super().__init__()
            self.net = SparseSequential(SubMConv3d(4, 8, 3, indice_key="s"), torch.nn.ReLU())

        def forward(self, x):
            return self.net(x)

    x = random_sparse(2, (6, 7, 8), 40, 4, dtype=torch.float32, seed=3)
    block = Block()
    assert isinstance(block.net[0], SparseConvolution)  # OpenPCDet's find_all_spconv_keys
    y = block(SparseConvTensor(x.features, x.indices, x.spatial_shape, x.batch_size))
    direct = block.net[0](_sp(x))
    assert torch.equal(y.features, torch.relu(direct.features)) and torch.equal(y.indices, x.indices)


def test_install_as_spconv_registers_core_and_constants(spconv_modules):
    # issue 33: spconv.core (ConvAlgo) and the spconv.constants flags that spconv's tests and user code read
    spconv.install_as_spconv()
    from spconv.core import ConvAlgo
    import spconv.constants as constants
    assert ConvAlgo is spconv.ConvAlgo and ConvAlgo.Native.value == 0 and ConvAlgo.MaskImplicitGemm.value == 1
    assert importlib.import_module("spconv").core is sys.modules["spconv.core"]
    # spconv 2.3.8's values: weights KRSC ([out, *kernel, in], which cvops.spconv's are), not HWIO
    assert constants.ALL_WEIGHT_IS_KRSC is True and constants.FILTER_HWIO is False
    assert constants.SAVED_WEIGHT_LAYOUT == "" and constants.SPCONV_USE_DIRECT_TABLE is True
    assert spconv.SubMConv3d(2, 3, 3).weight.shape == (3, 3, 3, 3, 2)


@pytest.mark.parametrize("subm,transpose", [(False, False), (True, False), (False, True)])
def test_ops_get_indice_pairs_takes_an_int_for_every_geometry_argument(subm, transpose, cpu_path):
    # issue 33: an int kernel size and dilation were taken, an int stride or padding raised TypeError
    x = random_sparse(2, (6, 7, 8), 50, 1, seed=36)
    shape, stride, pad = x.spatial_shape, (1 if subm else 2), 1
    ints = spconv.ops.get_indice_pairs(x.indices, 2, shape, spconv.ConvAlgo.Native, 3, stride, pad, 1, 0,
                                       subm=subm, transpose=transpose)
    lists = spconv.ops.get_indice_pairs(x.indices, 2, shape, spconv.ConvAlgo.Native, [3] * 3, [stride] * 3,
                                        [pad] * 3, [1] * 3, [0] * 3, subm=subm, transpose=transpose)
    assert all(torch.equal(a, b) for a, b in zip(ints, lists))
    with pytest.raises(BadParamError, match="stride must be an int or 3 ints"):
        spconv.ops.get_indice_pairs(x.indices, 2, shape, None, 3, [2, 2], 1, 1, 0)


def test_patches_of_sparse_module_reach_every_conv_layer(monkeypatch):
    """mmdet3d's register_spconv2 sets ``_version = 2`` and its own ``_load_from_state_dict`` on spconv.pytorch's
    SparseModule (to load mmcv-layout checkpoints): every conv layer it registers inherits both from SparseModule
    and overrides neither, so the patches reach them."""
    loaded = []

    def recording_load(self, state_dict, prefix, *args):
        loaded.append(type(self).__name__)
        torch.nn.Module._load_from_state_dict(self, state_dict, prefix, *args)

    monkeypatch.setattr(spconv.SparseModule, "_version", 2, raising=False)
    monkeypatch.setattr(spconv.SparseModule, "_load_from_state_dict", recording_load)
    names = [f"{kind}{n}d" for kind in ("SparseConv", "SubMConv") for n in (2, 3, 4)]
    names += [f"{kind}{n}d" for kind in ("SparseInverseConv", "SparseConvTranspose") for n in (2, 3)]
    for name in names:
        cls = getattr(spconv, name)
        layer = cls(2, 3, 3, indice_key="k") if "Inverse" in name else cls(2, 3, 3)
        state = layer.state_dict()
        assert state._metadata[""]["version"] == 2, name
        layer.load_state_dict(state)
        assert loaded[-1] == name
