"""masked_conv2d's two CPU routes (``masked_im2col.route``): the work rule's choice on both sides of its
threshold, and each route against the reference backend: values, gradients, NaN/inf, strided masks, a frozen
weight without bias. Both cpu paths where the gather runs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cvops
import cvops.mmcv
from cvops.metrics import diff1, diff2
from cvops.ops.masked_im2col import route

ROUTES = ("gather", "dense")


def _force(monkeypatch, which: str) -> list:
    """Makes the rule pick ``which`` (a moved value and the fixed cost count +-10**30 flops) and returns
    the list that records each call of the dense route."""
    for name in ("MOVE_FLOPS", "CALL_FLOPS"):
        monkeypatch.setattr(route, name, 10**30 if which == "dense" else -10**30)
    return _record_dense(monkeypatch)


def _record_dense(monkeypatch) -> list:
    taken = []
    dense = route.dense
    monkeypatch.setattr(route, "dense", lambda *args: taken.append(1) or dense(*args))
    return taken


def _dense(x, mask, weight, bias, pad):
    return F.conv2d(x, weight, bias, padding=pad) * (mask[0] > 0)


def _inputs(dtype, out_channels, seed=5, shape=(6, 9, 11), ratio=0.6):
    gen = torch.Generator().manual_seed(seed)
    channels, height, width = shape
    x = torch.randn(1, channels, height, width, generator=gen, dtype=dtype)
    weight = torch.randn(out_channels, channels, 3, 3, generator=gen, dtype=dtype)
    bias = torch.randn(out_channels, generator=gen, dtype=dtype)
    mask = (torch.rand(1, height, width, generator=gen) > ratio).double()
    mask[0, 0, 0] = mask[0, -1, -1] = mask[0, height // 2, width // 2] = 1  # points on the border too
    return x, mask, weight, bias


def _off_points(out, mask):
    """The output positions off the mask points (an output larger or smaller than the mask too)."""
    keep = torch.zeros(out.shape[2:], dtype=torch.bool)
    rows, cols = min(out.shape[2], mask.shape[1]), min(out.shape[3], mask.shape[2])
    keep[:rows, :cols] = mask[0, :rows, :cols] > 0
    return ~keep


# ----------------------------------------------------------------------------------------------- the rule
def _least_dense_points(positions, weight):
    """The fewest points from which the rule takes the dense route (its inequality solved for M)."""
    out_channels, window = weight.shape[0], weight[0].numel()
    vector = max(out_channels, route.VECTOR_BYTES // weight.element_size())
    dense_work = positions * window * 2 * vector
    moves = route.GATHER_MARGIN * route.MOVE_FLOPS
    return -(-(dense_work - route.CALL_FLOPS) // (window * (2 * out_channels + moves)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("out_channels", [1, 4, 16, 80, 256])
@pytest.mark.parametrize("positions", [77, 1_050, 16_800])  # GA-RetinaNet's P7, P5 and P3 maps
def test_the_rule_switches_at_its_threshold(positions, out_channels, dtype):
    """Dense exactly where its 2*O'*K*P flops (O' = max(O, a vector of channels)) are no more than the gather's
    M*K*(2*O + GATHER_MARGIN*MOVE_FLOPS) + CALL_FLOPS."""
    weight = torch.empty(out_channels, 256, 3, 3, dtype=dtype)
    least = _least_dense_points(positions, weight)
    for points in (least - 1, least):
        if 0 <= points <= positions:
            assert route.dense_is_cheaper(points, positions, weight) == (points == least)
    if least > positions:  # the gather even of every position is less work
        assert not route.dense_is_cheaper(positions, positions, weight)
    if least <= 0:  # the gather's fixed cost alone outweighs the dense convolution
        assert route.dense_is_cheaper(0, positions, weight)


def test_the_rule_on_ga_retinanet():
    """256 -> 256 channels gather at 10% and 30% masked on P3-P7; so does 256 -> 4 at 10% of P3 (the dense
    convolution computes 16 float32 output channels for the cost of 4), but not at 30%, where the gather's
    moves, counted with the margin, outweigh that; on P7 256 -> 4 convolve densely, the gather's fixed cost
    outweighing the whole convolution. Every position masked: dense."""
    wide, narrow = torch.empty(256, 256, 3, 3), torch.empty(4, 256, 3, 3)
    for positions in (16_700, 4_200, 1_050, 273, 77):
        for share in (0.1, 0.3):
            assert not route.dense_is_cheaper(round(share * positions), positions, wide)
    assert not route.dense_is_cheaper(1_670, 16_700, narrow) and route.dense_is_cheaper(5_010, 16_700, narrow)
    assert route.dense_is_cheaper(8, 77, narrow)
    assert route.dense_is_cheaper(16_700, 16_700, wide)


@pytest.mark.parametrize("dense", [False, True])
def test_masked_conv2d_takes_the_route_of_the_rule(dense, monkeypatch, cpu_path):
    # 64 -> 4 channels on a 64x64 map: the rule's threshold lies between 0 and 4096 points
    x, _, weight, bias = _inputs(torch.float32, 4, shape=(64, 64, 64))
    least = _least_dense_points(64 * 64, weight)
    assert 0 < least < 64 * 64
    mask = torch.zeros(1, 64, 64)
    mask.view(-1)[torch.randperm(64 * 64, generator=torch.Generator().manual_seed(0))[:least - 1 + dense]] = 1
    taken = _record_dense(monkeypatch)
    out = cvops.masked_conv2d(x, mask, weight, bias, 1)
    assert bool(taken) == dense
    assert diff1(out, _dense(x, mask, weight, bias, 1)) <= 1e-5
    # other backends and dtypes: the gather route, whatever the rule says
    keep = torch.ones(64, 64, dtype=torch.bool)
    assert route.takes_dense(x, weight, 4096, keep, None)
    assert not route.takes_dense(x, weight, 4096, keep, "reference")
    assert not route.takes_dense(x.half(), weight.half(), 4096, keep, None)


# ----------------------------------------------------------------------------------------- both routes
@pytest.mark.parametrize("out_channels", [5, 64])  # fewer and more output channels than points: both products
@pytest.mark.parametrize("pad", [(1, 1), (2, 0), (0, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("which", ROUTES)
def test_each_route_matches_the_reference_forward_and_backward(which, dtype, pad, out_channels, monkeypatch):
    x, mask, weight, bias = _inputs(dtype, out_channels)
    taken = _force(monkeypatch, which)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    got = cvops.masked_conv2d(*leaves[:1], mask, *leaves[1:], pad)
    assert bool(taken) == (which == "dense")
    want_leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    want = cvops.masked_conv2d(want_leaves[0], mask, *want_leaves[1:], pad, backend="reference")
    grad = torch.randn_like(want)
    tol = 3e-3 if dtype == torch.float32 else 1e-10
    grads = zip(torch.autograd.grad(got, leaves, grad), torch.autograd.grad(want, want_leaves, grad))
    pairs = [(got, want), *grads]
    for a, b in pairs:
        assert a.shape == b.shape and a.dtype == dtype
        assert diff1(a, b) <= tol and diff2(a, b) <= tol
    off = _off_points(got, mask)
    assert bool((got[:, :, off] == 0).all()) and not torch.signbit(got[:, :, off]).any()  # exact zeros, not -0.0
    with torch.no_grad():
        assert diff1(cvops.masked_conv2d(x, mask, weight, None, pad), want - bias[:, None, None] * ~off) <= tol


@pytest.mark.parametrize("which", ROUTES)
def test_nan_and_inf_in_the_features(which, monkeypatch, cpu_path):
    """NaN/inf inside the points' windows reach the same outputs as in the reference; values off the
    points never reach an output or a gradient (the dense route leaves the weight gradient to the
    gather route when a feature value is not finite)."""
    x, mask, weight, bias = _inputs(torch.float64, 5)
    mask[0, :3] = 0  # rows 0-1 are then outside every point's window
    x[0, 1, 0, 0] = float("inf")  # off the points' windows
    x[0, 2, 1, 4] = float("nan")
    x[0, 3, 8, 10] = float("-inf")  # (8, 10) is a point
    x[0, 0, 5, 5] = float("nan")
    taken = _force(monkeypatch, which)
    want_leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    want = cvops.masked_conv2d(want_leaves[0], mask, *want_leaves[1:], 1, backend="reference")
    grad = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, want_leaves, grad)
    # the points' windows hold NaN and -inf: so do the output and the weight gradient; the features' does not
    assert want.isnan().any() and want.isinf().any() and not want_grads[1].isfinite().all()
    assert want_grads[0].isfinite().all()
    for weight_grad in (False, True):
        taken.clear()
        leaves = [x.clone().requires_grad_(), weight.clone().requires_grad_(weight_grad), bias.clone()]
        got = cvops.masked_conv2d(leaves[0], mask, *leaves[1:], 1)
        assert bool(taken) == (which == "dense" and not weight_grad)
        got_grads = torch.autograd.grad(got, leaves[:1 + weight_grad], grad)
        for a, b in [(got, want)] + list(zip(got_grads, want_grads)):
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())
            finite = b.isfinite()
            torch.testing.assert_close(a[finite], b[finite], rtol=1e-10, atol=1e-10)
        off = _off_points(got, mask)
        assert bool((got[:, :, off] == 0).all())


def _strided_masks(h, w):
    """The same random mask as a transposed view, a sliced view and a contiguous tensor."""
    base = (torch.rand(1, w, h, generator=torch.Generator().manual_seed(3)) > 0.6).float()
    wide = torch.zeros(1, h, 2 * w)
    wide[..., ::2] = base.transpose(1, 2)
    return {"transposed": base.transpose(1, 2), "sliced": wide[..., ::2],
            "contiguous": base.transpose(1, 2).contiguous()}


@pytest.mark.parametrize("which", ROUTES)
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "contiguous"])
def test_a_strided_mask_gives_the_contiguous_masks_result(layout, grad, which, monkeypatch, cpu_path):
    # issue 33: under no_grad a transposed mask raised "view size is not compatible with input tensor's size
    # and stride" in the route planner; with autograd it worked
    torch.manual_seed(0)
    x = torch.randn(1, 8, 12, 10, dtype=torch.float64)
    weight = torch.randn(5, 8, 3, 3, dtype=torch.float64)
    bias = torch.randn(5, dtype=torch.float64)
    mask = _strided_masks(12, 10)[layout]
    assert mask.is_contiguous() == (layout == "contiguous")
    expected = _dense(x, mask, weight, bias, 1)
    taken = _force(monkeypatch, which)
    with torch.set_grad_enabled(grad):
        for fn in (cvops.masked_conv2d, cvops.mmcv.masked_conv2d):
            got = fn(x.requires_grad_(grad), mask, weight, bias, 1)
            torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-12, atol=1e-12)
    assert bool(taken) == (which == "dense")


@pytest.mark.parametrize("which", ROUTES)
def test_features_gradient_with_a_frozen_weight_and_no_bias(which, monkeypatch, cpu_path):
    # only the features need a gradient (a route planner that looked at the weight and bias alone once ran
    # an inference-only route here, which raised inside index_select(out=...))
    torch.manual_seed(1)
    x = torch.randn(1, 64, 64, 64, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(8, 64, 3, 3, dtype=torch.float64)
    mask = (torch.rand(1, 64, 64, generator=torch.Generator().manual_seed(0)) > 0.998).double()
    taken = _force(monkeypatch, which)
    out = cvops.masked_conv2d(x, mask, weight, None, 1)
    assert bool(taken) == (which == "dense")
    grad = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, x, grad)
    ref = x.detach().requires_grad_()
    (want,) = torch.autograd.grad(_dense(ref, mask, weight, None, 1), ref, grad)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    module = cvops.nn.MaskedConv2d(64, 8, 3, padding=1, bias=False).double().requires_grad_(False)
    module.weight.copy_(weight)
    torch.testing.assert_close(module(x, mask).detach(), out.detach(), rtol=0, atol=0)
    assert module(x, mask).requires_grad


@pytest.mark.parametrize("which", ROUTES)
def test_an_in_place_weight_update_is_seen(which, monkeypatch):
    _force(monkeypatch, which)
    x, mask = torch.randn(1, 3, 6, 7), (torch.rand(1, 6, 7) > 0.5).float()
    weight = torch.randn(2, 3, 3, 3)
    first = cvops.masked_conv2d(x, mask, weight, None, 1)
    weight.mul_(2)
    second = cvops.masked_conv2d(x, mask, weight, None, 1)
    assert torch.allclose(second, 2 * first, rtol=1e-5, atol=1e-5) and bool((first != 0).any())


def test_masked_conv2d_empty_mask_gives_zeros():
    out = cvops.masked_conv2d(torch.randn(1, 3, 5, 5), torch.zeros(1, 5, 5), torch.randn(2, 3, 3, 3),
                              torch.randn(2), 1)
    assert out.shape == (1, 2, 5, 5) and bool((out == 0).all())
