"""cvops.sparse: sparse convolution layers on get_indice_pairs, checked against dense torch convolutions.

The shared op tester runs :func:`cvops.sparse.indice_conv` (forward and both gradients) on every backend against
the loop reference (float32 within diff1/diff2 1e-6, half types within 3e-3 of the float64 reference), with
non-contiguous inputs, NaN and infinities, zero rows, bad input, gradcheck, opcheck, compile and export. Here:
every layer (SparseConv, SubMConv, SparseInverseConv, 2-D and 3-D) must equal the dense convolution of
``.dense()`` restricted to the output sites, forward and both gradients; the modules, weights and cache.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cvops import sparse
from cvops._core.errors import BadParamError, NotSupportedError
from cvops.metrics import bit_equal, diff1, diff2
from tests.conftest import requires_triton
from tests.ops._sparse_kmap import MAP_CASES, build_kernel_map, map_case, random_sparse
from tests.support.anchors import spconv_pytorch
from tests.support.op_tester import OpTester, Sample


def conv_sample(feats, weight, pairs, num, num_out, inverse, ident, dtype=torch.float32, seed=1):
    """An ``indice_conv`` call on a kernel map, with the gradient of its output for the backward."""
    grad = torch.randn(num_out, weight.shape[2], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return Sample(feats=feats.to(dtype), weight=weight.to(dtype), grad=grad.to(dtype), pairs=pairs, num=num,
                  num_out=num_out, inverse=inverse, ident=ident)


def _good():
    feats, weight, pairs, num, num_out, _, _ = map_case(seed=17)
    return dict(features=feats, weight=weight, indice_pairs=pairs, indice_num=num, num_out=num_out)


def _bad(change, match):
    def call(backend):
        args = _good()
        args["indice_pairs"] = args["indice_pairs"].clone()
        change(args)
        return sparse.indice_conv(**{"backend": backend, **args})
    return (match, call, BadParamError, match)


def _gradcheck_sample(subm):
    x = random_sparse(1, (3, 4, 3), 9, 2, seed=11)
    stride = 1 if subm else 2
    out, pairs, num = build_kernel_map(x.indices, 1, x.spatial_shape, [3, 3, 3], [stride] * 3, [1] * 3, [1] * 3,
                                       subm=subm)
    weight = torch.randn(27, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(int(subm)))
    return conv_sample(x.features, weight, pairs, num, out.shape[0], False, 13 if subm else -1, torch.float64)


class TestIndiceConv(OpTester):
    op = "sparse_conv"
    exact = False
    special_inputs = ("feats", "grad")
    reference_in_float64 = True    # half types are held to the float64 result, not to its rounding
    gradcheck_fast = ("reference", "triton")
    opcheck_backward = False       # the backward op has no gradient of its own (as in spconv)
    property_examples = {}
    bad_inputs = tuple(_bad(change, match) for change, match in [
        (lambda a: a.update(features=a["features"].int()), "features dtype"),
        (lambda a: a.update(features=a["features"][None]), "features must be 2-D"),
        (lambda a: a.update(weight=a["weight"].double()), "weight dtype"),
        (lambda a: a.update(weight=a["weight"][:, :2]), "in_channels"),
        (lambda a: a.update(weight=a["weight"][:26]), r"indice_pairs must be \[K=26"),
        (lambda a: a.update(indice_pairs=a["indice_pairs"].float()), "indice_pairs dtype"),
        (lambda a: a.update(indice_pairs=a["indice_pairs"][:, :1]), r"indice_pairs must be \[K=27, 2, L\]"),
        (lambda a: a.update(indice_num=a["indice_num"][:5]), "indice_num must have K=27"),
        (lambda a: a.update(indice_num=a["indice_num"] + 1000), r"indice_num values must lie in \[0, L"),
        (lambda a: a.update(num_out=-1), "num_out must be >= 0"),
        (lambda a: a.update(num_out=1.5), "num_out must be an int"),
        (lambda a: a.update(num_out=1), r"indice_pairs\[:, 1\] \(output rows\) must lie in \[0, 1\)"),
        (lambda a: a["indice_pairs"].__setitem__((0, 0, 0), 10**6) if int(a["indice_num"][0]) else
         a["indice_pairs"].__setitem__((13, 0, 0), 10**6), r"indice_pairs\[:, 0\] \(input rows\)"),
        (lambda a: a.update(inverse=1), "inverse must be a bool"),
        (lambda a: a.update(identity_offset=27), "identity_offset"),
        (lambda a: a.update(identity_offset=13), "identity_offset 13 needs"),
        (lambda a: a.update(backend="cuda"), "backend must be one of"),
    ])

    def unit_cases(self):
        return [{"name": name, **params} for name, params in MAP_CASES.items()]

    def case_samples(self, case, layout, dtype):
        params = {k: v for k, v in case.items() if k != "name"}
        return [conv_sample(*map_case(**params), dtype)]

    def small_samples(self, layout, dtype):
        return [conv_sample(*map_case(subm=True, seed=9, n=40), dtype)]

    def grad_samples(self, layout):
        return [_gradcheck_sample(subm) for subm in (False, True)]

    def zero_samples(self, layout):
        none = torch.full((27, 2, 0), -1, dtype=torch.int32), torch.zeros(27, dtype=torch.int32)
        unpaired = torch.full((27, 2, 5), -1, dtype=torch.int32), torch.zeros(27, dtype=torch.int32)
        weight = torch.randn(27, 3, 2, dtype=torch.float64)
        return [(conv_sample(torch.zeros(0, 3), weight, *none, 0, False, -1, torch.float64),
                 ((0, 2), (0, 3), (27, 3, 2))),
                # input rows but no pairs and no output rows: empty output, zero gradients
                (conv_sample(torch.randn(5, 3), weight, *unpaired, 0, False, -1, torch.float64),
                 ((0, 2), (5, 3), (27, 3, 2)))]

    def run(self, s, backend):
        f, w = s.feats.detach().requires_grad_(), s.weight.detach().requires_grad_()
        out = sparse.indice_conv(f, w, s.pairs, s.num, s.num_out, inverse=s.inverse, identity_offset=s.ident,
                                 backend=backend)
        return (out.detach(), *torch.autograd.grad(out, (f, w), s.grad))

    def autograd(self, s, backend):
        return (lambda f, w: sparse.indice_conv(f, w, s.pairs, s.num, s.num_out, inverse=s.inverse,
                                                identity_offset=s.ident, backend=backend)), (s.feats, s.weight)

    def tolerance(self, dtype, backend):
        return {torch.float64: 1e-12, torch.float32: 1e-6}.get(dtype, 3e-3)


@pytest.mark.parametrize("subm,kernel,stride,padding,dilation", [
    (True, 3, 1, 1, 1), (True, 3, 1, 0, 1), (False, 3, 2, 1, 1), (False, (3, 2, 3), (2, 1, 2), (0, 1, 1), 1),
    (False, 3, 1, 2, 2)])
def test_layers_use_the_contract_kernel_map(subm, kernel, stride, padding, dilation):
    # the layers call cvops.get_indice_pairs; it must give the contract's map (test-only builder)
    x = random_sparse(2, (5, 6, 7), 40, 1, seed=21)
    k3 = sparse.SparseConv3d(1, 1, kernel, stride, padding, dilation)
    got = sparse.get_indice_pairs_nd(x.indices, 2, x.spatial_shape, k3.kernel_size, k3.stride, k3.padding,
                                     k3.dilation, subm)
    expected = build_kernel_map(x.indices, 2, x.spatial_shape, k3.kernel_size, k3.stride, k3.padding, k3.dilation,
                                subm=subm)
    for a, b in zip(got, expected):
        assert bit_equal(a, b)


def _site_mask(y: sparse.SparseConvTensor) -> torch.Tensor:
    ones = sparse.SparseConvTensor(torch.ones(y.indices.shape[0], 1, dtype=torch.float64), y.indices,
                                   y.spatial_shape, y.batch_size)
    return ones.dense()


def dense_reference(layer, xd: torch.Tensor, weight: torch.Tensor):
    """The dense convolution the sparse layer computes, on a dense input ``xd [B, C, *spatial]``."""
    nd = layer.ndim
    conv = F.conv3d if nd == 3 else F.conv2d
    w = sparse.convert_weight(weight, layer.WEIGHT_LAYOUT, "torch")
    if layer.subm:  # output grid = input grid, kernel centred (padding ignored): pad d*(k//2) left
        pads = []
        for k, d in reversed(list(zip(layer.kernel_size, layer.dilation))):
            pads += [d * (k // 2), d * (k - 1) - d * (k // 2)]
        return conv(F.pad(xd, pads), w, None, 1, 0, layer.dilation)
    return conv(xd, w, None, layer.stride, layer.padding, layer.dilation)


def check_against_dense(layer, x: sparse.SparseConvTensor, atol=1e-10):
    feats = x.features.detach().clone().requires_grad_()
    x = x.replace_feature(feats)
    y = layer(x)
    mask = _site_mask(y)
    gen = torch.Generator().manual_seed(7)
    grad_dense = torch.randn(y.dense().shape, generator=gen, dtype=torch.float64)
    (y.dense() * grad_dense).sum().backward()

    feats_ref = x.features.detach().clone().requires_grad_()
    weight_ref = layer.weight.detach().clone().requires_grad_()
    ref = dense_reference(layer, x.replace_feature(feats_ref).dense(), weight_ref)
    assert ref.shape == y.dense().shape
    if not layer.subm:  # every site the dense conv reaches must be an output site
        assert torch.all((ref * (1 - mask)).abs() < atol)
    ref = ref * mask
    if layer.bias is not None:
        ref = ref + layer.bias.detach().view(1, -1, *[1] * layer.ndim) * mask
    (ref * grad_dense).sum().backward()
    torch.testing.assert_close(y.dense(), ref.detach(), atol=atol, rtol=1e-9)
    torch.testing.assert_close(feats.grad, feats_ref.grad, atol=atol, rtol=1e-9)
    torch.testing.assert_close(layer.weight.grad, weight_ref.grad, atol=atol, rtol=1e-9)
    return y


# ----------------------------------------------------------------------------- dense equivalence
CONV3D = [  # kernel, stride, padding, dilation
    (3, 1, 0, 1), (3, 1, 1, 1), (3, 2, 1, 1), (2, 2, 0, 1), (3, 2, (0, 1, 1), 1),
    ((3, 2, 3), (2, 1, 2), (1, 0, 1), 1), (3, 1, 2, 2), ((2, 3, 1), 1, (1, 2, 0), (2, 2, 1)),
    (1, 1, 1, 1),  # mmcv#3164: a 1x1x1 kernel with padding moves the sites
    (1, 1, 0, 1),
]


@pytest.mark.parametrize("kernel,stride,padding,dilation", CONV3D)
def test_sparse_conv3d_matches_dense(kernel, stride, padding, dilation):
    x = random_sparse(2, (5, 6, 7), 40, 3, seed=1)
    layer = sparse.SparseConv3d(3, 4, kernel, stride, padding, dilation, bias=False).double()
    check_against_dense(layer, x)


@pytest.mark.parametrize("kernel,padding,dilation", [(3, 1, 1), (3, 0, 1), (3, 2, 1), (3, 2, 2), ((3, 1, 5), (1, 0, 2), 1),
                                                     (2, 0, 1), (2, 1, 1)])
def test_subm_conv3d_matches_dense(kernel, padding, dilation):
    x = random_sparse(2, (5, 6, 7), 50, 3, seed=2)
    layer = sparse.SubMConv3d(3, 5, kernel, 1, padding, dilation, bias=True).double()
    y = check_against_dense(layer, x)
    assert torch.equal(y.indices, x.indices)


@pytest.mark.parametrize("subm,kernel,stride,padding", [(False, 3, 2, 1), (False, 2, 1, 0), (True, 3, 1, 1),
                                                        (True, (3, 5), 1, (1, 2))])
def test_conv2d_variants_match_dense(subm, kernel, stride, padding):
    x = random_sparse(2, (7, 9), 30, 2, seed=3)
    cls = sparse.SubMConv2d if subm else sparse.SparseConv2d
    layer = cls(2, 3, kernel, stride, padding).double()
    check_against_dense(layer, x)


@pytest.mark.parametrize("kernel,stride,padding", [(3, 2, 1), (2, 2, 0), (3, 1, 1), ((3, 2, 3), (2, 2, 1), (1, 0, 1))])
def test_inverse_conv3d_is_transposed_conv_on_input_sites(kernel, stride, padding):
    x = random_sparse(2, (6, 5, 7), 45, 3, seed=4)
    down = sparse.SparseConv3d(3, 4, kernel, stride, padding, indice_key="down").double()
    up = sparse.SparseInverseConv3d(4, 2, kernel, indice_key="down").double()
    y = down(x)
    feats = y.features.detach().clone().requires_grad_()
    z = up(y.replace_feature(feats))
    assert torch.equal(z.indices, x.indices) and z.spatial_shape == x.spatial_shape
    grad = torch.randn(z.features.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (z.features * grad).sum().backward()

    feats_ref = y.features.detach().clone().requires_grad_()
    weight_ref = up.weight.detach().clone().requires_grad_()
    yd = y.replace_feature(feats_ref).dense()
    # conv_transpose weight is [C_in, C_out, *k]; the layer's is spconv's [C_out, *k, C_in]
    w = weight_ref.permute(4, 0, 1, 2, 3)
    out_pad = [i - ((o - 1) * s - 2 * p + (k - 1) + 1) for i, o, s, p, k in
               zip(x.spatial_shape, y.spatial_shape, down.stride, down.padding, down.kernel_size)]
    ref = F.conv_transpose3d(yd, w, None, down.stride, down.padding, out_pad, 1, down.dilation)
    coords = tuple(c.long() for c in x.indices.t())
    ref_rows = ref.permute(0, 2, 3, 4, 1)[coords] + up.bias.detach()
    (ref_rows * grad).sum().backward()
    torch.testing.assert_close(z.features, ref_rows.detach(), atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(feats.grad, feats_ref.grad, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(up.weight.grad, weight_ref.grad, atol=1e-10, rtol=1e-9)


# ----------------------------------------------------------------------------- backends and dtypes
@pytest.mark.parametrize("inverse", [False, True])
def test_pairs_sorted_by_output_give_the_same_result(inverse):
    feats, weight, pairs, num, num_out, inverse, ident = map_case(inverse=inverse, seed=19)
    by_out = sparse.sort_pairs_by_output(pairs, num)
    for k in range(27):  # a permutation of each offset's valid pairs, ascending output row, -1 tail
        n = int(num[k])
        assert sorted(map(tuple, by_out[k, :, :n].t().tolist())) == sorted(map(tuple, pairs[k, :, :n].t().tolist()))
        assert torch.all(by_out[k, 1, :n].diff() > 0) and torch.all(by_out[k, :, n:] == -1)
    f, w = feats.clone().requires_grad_(), weight.clone().requires_grad_()
    runs = []
    for extra in ({}, {"indice_pairs_by_output": by_out}):
        out = sparse.indice_conv(f, w, pairs, num, num_out, inverse=inverse, **extra)
        runs.append((out, *torch.autograd.grad(out, (f, w), torch.ones_like(out))))
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    bad = by_out.clone()
    bad[0, 0, 0] = 10**6
    if int(num[0]):
        with pytest.raises(BadParamError, match="must lie in"):
            sparse.indice_conv(f, w, pairs, num, num_out, inverse=inverse, indice_pairs_by_output=bad)


@requires_triton
def test_triton_gather_scatter_rows():
    from cvops.sparse import triton as tri
    g = torch.Generator().manual_seed(0)
    src = torch.randn(50, 7, generator=g)
    idx = torch.randperm(50, generator=g)[:33].to(torch.int32)
    assert bit_equal(tri.gather_rows(src, idx), src[idx.long()])
    dst = torch.randn(60, 7, generator=g)
    expected = dst.clone()
    expected[idx.long()] += src[:33]
    assert bit_equal(tri.scatter_add_rows(dst, idx, src[:33].contiguous()), expected)


def test_deterministic_bits():
    x = random_sparse(2, (6, 6, 6), 120, 8, dtype=torch.float32, seed=12)
    net = sparse.SparseSequential(sparse.SubMConv3d(8, 8, 3, padding=1, indice_key="s"),
                                  sparse.SparseConv3d(8, 16, 3, stride=2, padding=1))
    runs = []
    for _ in range(2):
        f = x.features.clone().requires_grad_()
        net.zero_grad()
        y = net(x.replace_feature(f))
        y.features.square().sum().backward()
        runs.append((y.features.detach(), f.grad, net[0].weight.grad.clone(), net[1].weight.grad.clone()))
    for a, b in zip(*runs):
        assert bit_equal(a, b)


def test_nan_propagates_only_to_reached_sites():
    feats, weight, pairs, num, num_out, _, _ = map_case(seed=13)
    feats = feats.clone()
    feats[0, 0] = float("nan")
    out = sparse.indice_conv(feats, weight, pairs, num, num_out)
    reached = set()
    for k in range(27):
        for i in range(int(num[k])):
            if int(pairs[k, 0, i]) == 0:
                reached.add(int(pairs[k, 1, i]))
    nan_rows = set(torch.nonzero(out.isnan().any(1)).flatten().tolist())
    assert reached and nan_rows == reached


# ----------------------------------------------------------------------------- modules, cache, weights
def test_indice_key_cache_and_sequential():
    x = random_sparse(2, (8, 8, 8), 100, 4, dtype=torch.float32, seed=14)
    net = sparse.SparseSequential(
        sparse.SubMConv3d(4, 8, 3, padding=1, bias=False, indice_key="subm1"), torch.nn.BatchNorm1d(8),
        torch.nn.ReLU(), sparse.SubMConv3d(8, 8, 3, padding=1, bias=False, indice_key="subm1"),
        sparse.SparseConv3d(8, 16, 3, stride=2, padding=1, indice_key="down1"),
        sparse.SparseInverseConv3d(16, 4, 3, indice_key="down1"))
    y = net(x)
    assert set(y.indice_dict) == {"subm1", "down1"}
    assert torch.equal(y.indices, x.indices) and y.features.shape == (100, 4)
    data = y.indice_dict["subm1"]
    assert data.indices is x.indices  # the second subm layer reused the first one's map
    y.features.sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_dense_layouts():
    x = random_sparse(2, (3, 4, 5), 10, 3, seed=15)
    d = x.dense()
    assert d.shape == (2, 3, 3, 4, 5)
    assert torch.equal(x.dense(channels_first=False), d.permute(0, 2, 3, 4, 1))
    b, z, yy, xx = x.indices[0].long().tolist()
    assert torch.equal(d[b, :, z, yy, xx], x.features[0])
    assert d.abs().sum() == pytest.approx(x.features.abs().sum().item())


def test_weight_layouts_roundtrip_and_load():
    g = torch.Generator().manual_seed(0)
    w_torch = torch.randn(5, 3, 2, 3, 4, generator=g)  # [out, in, kz, ky, kx]
    w_mmcv = sparse.convert_weight(w_torch, "torch")
    assert w_mmcv.shape == (2, 3, 4, 3, 5)
    assert torch.equal(w_mmcv[1, 2, 3, 0, 4], w_torch[4, 0, 1, 2, 3])
    w_spconv = sparse.convert_weight(w_mmcv, "mmcv", "spconv")
    assert w_spconv.shape == (5, 2, 3, 4, 3)
    assert torch.equal(w_spconv[4, 1, 2, 3, 0], w_torch[4, 0, 1, 2, 3])
    for layout in ("spconv", "RSKC", "torch", "mmcv"):
        assert torch.equal(sparse.convert_weight(sparse.convert_weight(w_mmcv, "mmcv", layout), layout), w_mmcv)
    layer = sparse.SparseConv3d(3, 5, (2, 3, 4))
    layer.load_state_dict({"weight": w_spconv, "bias": torch.zeros(5)})  # spconv 2.x layout: plain load
    assert torch.equal(layer.weight, w_spconv)
    layer.weight.data.zero_()
    sparse.load_state_dict(layer, {"weight": w_mmcv, "bias": torch.zeros(5)}, "mmcv")  # the documented call
    assert torch.equal(layer.weight, w_spconv)
    with pytest.raises(BadParamError, match="layout"):
        sparse.load_state_dict(layer, {"weight": w_mmcv, "bias": torch.zeros(5)}, "spconv")
    with pytest.raises(BadParamError, match="layout must be one of"):
        sparse.convert_weight(w_mmcv, "nchw")


# ----------------------------------------------------------------------------- bad parameters
def test_bad_module_parameters():
    with pytest.raises(NotSupportedError, match="groups"):
        sparse.SparseConv3d(2, 2, 3, groups=2)
    with pytest.raises(BadParamError, match="cannot both be > 1"):
        sparse.SparseConv3d(2, 2, 3, stride=2, dilation=2)
    with pytest.raises(BadParamError, match="subm needs stride 1"):
        sparse.SubMConv3d(2, 2, 3, stride=2)
    with pytest.raises(BadParamError, match="kernel_size must be an int or 3 ints"):
        sparse.SparseConv3d(2, 2, (3, 3))
    with pytest.raises(BadParamError, match="in_channels must be >= 1"):
        sparse.SparseConv3d(0, 2, 3)
    with pytest.raises(BadParamError, match="needs the indice_key"):
        sparse.SparseInverseConv3d(2, 2, 3, None)
    x = random_sparse(1, (4, 4, 4), 5, 2, seed=18)
    with pytest.raises(BadParamError, match="expects 3"):
        sparse.SubMConv3d(3, 2, 3, padding=1).double()(x)
    with pytest.raises(BadParamError, match="no kernel map cached"):
        sparse.SparseInverseConv3d(2, 2, 3, indice_key="nope").double()(x)
    with pytest.raises(BadParamError, match="input is 3-D"):
        sparse.SubMConv2d(2, 2, 3, padding=1).double()(x)
    y = sparse.SubMConv3d(2, 2, 3, padding=1, indice_key="k").double()(x)
    with pytest.raises(BadParamError, match="holds a subm map"):
        sparse.SparseConv3d(2, 2, 3, indice_key="k").double()(y)
    with pytest.raises(BadParamError, match=r"indices must be \[N, 4\]"):
        sparse.SparseConvTensor(x.features, x.indices[:, :3], [4, 4, 4], 1)
    with pytest.raises(BadParamError, match="indices rows"):
        sparse.SparseConvTensor(x.features[:3], x.indices, [4, 4, 4], 1)
    with pytest.raises(BadParamError, match="batch_size must be >= 1"):
        sparse.SparseConvTensor(x.features, x.indices, [4, 4, 4], 0)


def test_trusted_map_path_keeps_shape_and_count_checks():
    from cvops.sparse.functional import _indice_conv
    args = _good()
    trusted = dict(inverse=False, identity_offset=-1, indice_pairs_by_output=None, backend=None,
                   check_values=False)
    out = _indice_conv(**args, **trusted)
    torch.testing.assert_close(out, sparse.indice_conv(**args))
    with pytest.raises(BadParamError, match=r"indice_num values must lie in \[0, L"):
        _indice_conv(**{**args, "indice_num": args["indice_num"] + 1000}, **trusted)
    with pytest.raises(BadParamError, match="in_channels"):
        _indice_conv(**{**args, "weight": args["weight"][:, :2]}, **trusted)


def test_example_encoder_runs_forward_and_backward():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "examples" / "sparse_encoder.py"
    spec = importlib.util.spec_from_file_location("sparse_encoder", path)
    enc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enc)
    features, indices = enc.make_input(400, 2, (41, 48, 48), 5)
    net = enc.build_encoder(sparse, 5, 4)
    x = sparse.SparseConvTensor(features.requires_grad_(), indices, [41, 48, 48], 2)
    out = net(x)
    assert out.spatial_shape == [2, 6, 6] and out.features.shape[1] == 32
    enc.bev(out).square().mean().backward()
    assert features.grad.shape == features.shape and torch.isfinite(features.grad).all()
    assert all(p.grad is not None for p in net.parameters())


@requires_triton
def test_triton_rejects_repeated_rows_within_an_offset():
    args = _good()
    pairs = args["indice_pairs"].clone()
    k = int(torch.argmax(args["indice_num"]))
    assert int(args["indice_num"][k]) >= 2
    pairs[k, 1, 1] = pairs[k, 1, 0]  # two inputs scattering into one output row at one offset
    with pytest.raises(BadParamError, match="repeats an output row"):
        sparse.indice_conv(**{**args, "indice_pairs": pairs}, backend="triton")
    # the torch backend sums repeated rows correctly (index_add_), as the reference does
    out = sparse.indice_conv(**{**args, "indice_pairs": pairs}, backend="cpu")
    ref = sparse.indice_conv(**{**args, "indice_pairs": pairs}, backend="reference")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(spconv_pytorch() is None, reason="spconv not installed")
def test_layers_match_spconv_forward():
    # spconv 2.x's own layers on the same sites with its own [out, *k, in] weights, converted by
    # cvops.sparse.load_state_dict: subm, strided sparse conv, and the inverse conv restoring sites
    spt = spconv_pytorch()
    x = random_sparse(2, (9, 16, 16), 120, 4, dtype=torch.float32, seed=22)
    torch.manual_seed(0)
    ref = spt.SparseSequential(spt.SubMConv3d(4, 6, 3, padding=1, indice_key="s1"),
                               spt.SparseConv3d(6, 5, 3, stride=2, padding=1, indice_key="d1"),
                               spt.SparseInverseConv3d(5, 3, 3, indice_key="d1"))
    net = sparse.SparseSequential(sparse.SubMConv3d(4, 6, 3, padding=1, indice_key="s1"),
                                  sparse.SparseConv3d(6, 5, 3, stride=2, padding=1, indice_key="d1"),
                                  sparse.SparseInverseConv3d(5, 3, 3, indice_key="d1"))
    net.load_state_dict(ref.state_dict())  # spconv 2.x layout loads unchanged
    xs = spt.SparseConvTensor(x.features, x.indices, x.spatial_shape, x.batch_size)
    threads = torch.get_num_threads()
    for i in range(3):
        torch.set_num_threads(1)  # spconv's CPU results change from run to run on more threads
        try:
            xs = ref[i](xs)
        finally:
            torch.set_num_threads(threads)
        x = net[i](x)
        assert list(xs.spatial_shape) == x.spatial_shape and xs.features.shape == x.features.shape
        assert diff1(x.dense(), xs.dense()) < 1e-3 and diff2(x.dense(), xs.dense()) < 1e-3




@pytest.mark.parametrize("channels_first", [True, False])
def test_dense_round_trip_and_spatial_size(channels_first):
    """``dense()`` puts each row at its site (duplicates summed) in either layout, its gradient is the rows' own,
    and ``spatial_size`` is the grid's number of sites (spconv's names)."""
    indices = torch.tensor([[0, 1, 2, 3], [1, 0, 0, 0], [1, 0, 0, 0], [0, 4, 1, 2]], dtype=torch.int32)
    features = torch.arange(12, dtype=torch.float64).view(4, 3).requires_grad_()
    x = sparse.SparseConvTensor(features, indices, [5, 3, 4], 2)
    assert x.spatial_size == 60
    dense = x.dense(channels_first)
    cl = dense.movedim(1, -1) if channels_first else dense
    assert dense.shape == ((2, 3, 5, 3, 4) if channels_first else (2, 5, 3, 4, 3)) and dense.is_contiguous()
    assert torch.equal(cl[0, 1, 2, 3], features[0].detach()) and torch.equal(cl[0, 4, 1, 2], features[3].detach())
    assert torch.equal(cl[1, 0, 0, 0], (features[1] + features[2]).detach())
    assert int((cl != 0).any(-1).sum()) == 3
    weight = torch.randn(dense.shape, dtype=torch.float64)
    (dense * weight).sum().backward()
    w = weight.movedim(1, -1) if channels_first else weight
    want = torch.stack([w[0, 1, 2, 3], w[1, 0, 0, 0], w[1, 0, 0, 0], w[0, 4, 1, 2]])
    assert torch.equal(features.grad, want)
