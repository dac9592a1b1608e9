"""masked_conv2d's three CPU routes (``masked_im2col.route``): the work rule's choice on both sides of its
thresholds, and each route against the reference backend: values, gradients (a float64 gradcheck), NaN/inf,
strided masks, a frozen weight without bias. Both cpu paths where the gather runs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cvops
import cvops.mmcv
from cvops.metrics import diff1, diff2
from cvops.ops.masked_im2col import route

ROUTES = ("gather", "dense", "taps")


def _force(monkeypatch, which: str) -> list:
    """Makes the rule pick ``which`` and returns the list that records each call of the dense and taps routes."""
    monkeypatch.setattr(route, "cheapest", lambda *args: which)
    return _record_routes(monkeypatch)


def _record_routes(monkeypatch) -> list:
    taken = []
    for name in ("dense", "taps"):
        run = getattr(route, name)
        monkeypatch.setattr(route, name, lambda *args, _name=name, _run=run: taken.append(_name) or _run(*args))
    return taken


def _taken(which: str) -> list:
    """What :func:`_record_routes` records for one call of route ``which``."""
    return [] if which == "gather" else [which]


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
def _work(points, height, width, out_positions, weight):
    """Each route's work as the module docstring states it (flops, a moved value counted MOVE_FLOPS)."""
    out_channels, channels, kernel_h, kernel_w = weight.shape
    taps, window = kernel_h * kernel_w, channels * kernel_h * kernel_w
    vector = max(out_channels, route.VECTOR_BYTES // weight.element_size())
    return {"dense": out_positions * window * 2 * vector,
            "taps": height * width * window * 2 * out_channels + out_positions * taps * out_channels * route.MOVE_FLOPS,
            "gather": points * window * (2 * out_channels + route.GATHER_MARGIN * route.MOVE_FLOPS) + route.CALL_FLOPS}


def _least_work(work):
    least = min(work.values())
    return next(name for name in ("dense", "taps", "gather") if work[name] == least)  # ties: dense, then taps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("out_channels", [1, 4, 7, 15, 16, 80, 256])
@pytest.mark.parametrize("shape", [(7, 11), (25, 42), (100, 167)])  # GA-RetinaNet's P7, P5 and P3 maps
def test_the_rule_takes_the_least_work(shape, out_channels, dtype):
    """At every point count (sampled, and on both sides of each switch) the rule's route is the one of least
    work as the docstring counts it; the rule's answer changes only where that least-work route does."""
    height, width = shape
    positions = height * width
    weight = torch.empty(out_channels, 256, 3, 3, dtype=dtype)
    features = torch.empty(1, 256, height, width, dtype=dtype)
    counts = sorted({round(positions * k / 64) for k in range(65)})
    got = [route.cheapest(m, features, positions, weight) for m in counts]
    assert got == [_least_work(_work(m, height, width, positions, weight)) for m in counts]
    for before, after, m0, m1 in zip(got, got[1:], counts, counts[1:]):
        if before != after:  # bisect to the switch: both sides as the work says
            while m1 - m0 > 1:
                mid = (m0 + m1) // 2
                m0, m1 = (mid, m1) if route.cheapest(mid, features, positions, weight) == before else (m0, mid)
            assert _least_work(_work(m0, height, width, positions, weight)) == before
            assert _least_work(_work(m1, height, width, positions, weight)) == after
    # the taps route needs fewer output channels than the dense convolution's vector to win
    if out_channels >= route.VECTOR_BYTES // weight.element_size():
        assert "taps" not in got


def test_the_rule_on_ga_retinanet():
    """256 -> 256 and 256 -> 80 channels gather at 10% and 30% masked on P3-P7; 256 -> 4 (the loc branch)
    multiply the map by every tap (4 output channels cost the dense convolution a vector of 16), and gather
    only below about 6% of a large map. Every position masked: dense, except 256 -> 4: taps."""
    features = {positions: torch.empty(1, 256, 1, positions) for positions in (16_700, 4_200, 1_050, 273, 77)}
    wide, cls, narrow = torch.empty(256, 256, 3, 3), torch.empty(80, 256, 3, 3), torch.empty(4, 256, 3, 3)
    for positions, x in features.items():
        for share in (0.1, 0.3):
            points = round(share * positions)
            assert route.cheapest(points, x, positions, wide) == "gather"
            assert route.cheapest(points, x, positions, cls) == "gather"
            assert route.cheapest(points, x, positions, narrow) == "taps"
        assert route.cheapest(positions, x, positions, wide) == "dense"
        assert route.cheapest(positions, x, positions, narrow) == "taps"
    assert route.cheapest(500, features[16_700], 16_700, narrow) == "gather"


def test_a_padding_beyond_the_kernel_takes_no_taps():
    """The taps route's fold pads by ``k - 1 - pad``: a larger padding goes to the next cheapest route, whose
    output (larger than the mask) still matches the reference."""
    x, mask, weight, bias = _inputs(torch.float64, 4, shape=(256, 7, 11), ratio=0.9)
    keep = torch.ones(7, 11, dtype=torch.bool)
    assert route.choose(x, weight, keep, (1, 1), None) == "taps"
    assert route.choose(x, weight, keep, (3, 1), None) not in ("taps", "gather")
    got = cvops.masked_conv2d(x, mask, weight, bias, (3, 1))
    want = cvops.masked_conv2d(x, mask, weight, bias, (3, 1), backend="reference")
    assert got.shape == (1, 4, 11, 11) and diff1(got, want) <= 1e-12


@pytest.mark.parametrize("out_channels, switch", [(4, ("gather", "taps")), (64, ("gather", "dense"))])
def test_masked_conv2d_takes_the_route_of_the_rule(out_channels, switch, monkeypatch, cpu_path):
    # 64 channels on a 64x64 map: the rule switches routes between 0 and 4096 points
    x, _, weight, bias = _inputs(torch.float32, out_channels, shape=(64, 64, 64))
    least = next(m for m in range(4097) if route.cheapest(m, x, 64 * 64, weight) == switch[1])
    assert 0 < least < 64 * 64 and route.cheapest(least - 1, x, 64 * 64, weight) == switch[0]
    order = torch.randperm(64 * 64, generator=torch.Generator().manual_seed(0))
    taken = _record_routes(monkeypatch)
    for points, which in ((least - 1, switch[0]), (least, switch[1])):
        mask = torch.zeros(1, 64, 64)
        mask.view(-1)[order[:points]] = 1
        taken.clear()
        out = cvops.masked_conv2d(x, mask, weight, bias, 1)
        assert taken == _taken(which)
        assert diff1(out, _dense(x, mask, weight, bias, 1)) <= 1e-5
    # other backends and dtypes: the gather route, whatever the rule says
    keep = torch.ones(64, 64, dtype=torch.bool)
    assert route.choose(x, weight, keep, (1, 1), None) == route.cheapest(4096, x, 4096, weight) != "gather"
    assert route.choose(x, weight, keep, (1, 1), "reference") == "gather"
    assert route.choose(x.half(), weight.half(), keep, (1, 1), None) == "gather"


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
    assert taken == _taken(which)
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


@pytest.mark.parametrize("pad", [(1, 1), (2, 0), (0, 1)])
@pytest.mark.parametrize("which", ROUTES)
def test_gradcheck_of_each_route(which, pad, monkeypatch):
    """Float64 gradcheck and gradgradcheck (features, weight, bias) of the route on a small map."""
    x, mask, weight, bias = (t.requires_grad_(t.is_floating_point() and t.dim() != 3)
                             for t in _inputs(torch.float64, 3, shape=(4, 6, 7)))
    taken = _force(monkeypatch, which)

    def conv(x, weight, bias):
        return cvops.masked_conv2d(x, mask, weight, bias, pad)

    assert torch.autograd.gradcheck(conv, (x, weight, bias))
    assert torch.autograd.gradgradcheck(conv, (x, weight, bias))
    assert set(taken) == set(_taken(which))


@pytest.mark.parametrize("which", ROUTES)
def test_nan_and_inf_in_the_features(which, monkeypatch, cpu_path):
    """NaN/inf inside the points' windows reach the same outputs as in the reference; values off the
    points never reach an output or a gradient (the dense and taps routes leave the weight gradient to the
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
        assert taken == ([] if weight_grad else _taken(which))
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
    assert taken == _taken(which) * 2  # both functions


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
    assert taken == _taken(which)
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


@pytest.mark.parametrize("block_bytes", [1, 3 * 8 * 9 * 8, 1 << 30])  # a point, 3 (float64) or 6 points, one block
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("out_channels", [5, 64])  # products stored along the points, and a point per row
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gather_route_without_gradients_runs_in_blocks(dtype, out_channels, with_bias, block_bytes, monkeypatch,
                                                           cpu_path):
    """Without gradients the gather route multiplies blocks of points' columns (``route.blocked_product``): any
    block size gives the autograd path's values, with zeros off the points."""
    x, mask, weight, bias = _inputs(dtype, out_channels, shape=(8, 9, 11))
    bias = bias if with_bias else None
    _force(monkeypatch, "gather")
    spans = []  # the (lo, hi) of each block of points whose columns are gathered
    product = route.blocked_product
    monkeypatch.setattr(route, "blocked_product", lambda weight_2d, bias, count, columns: product(
        weight_2d, bias, count, lambda lo, hi: spans.append((lo, hi)) or columns(lo, hi)))
    monkeypatch.setattr("cvops._core.memory.BLOCK_BYTES", block_bytes)
    want = cvops.masked_conv2d(x.clone().requires_grad_(), mask, weight, bias, 1)
    assert spans == []  # a gradient is wanted: the one product autograd differentiates
    with torch.no_grad():
        got = cvops.masked_conv2d(x, mask, weight, bias, 1)
    points = int((mask > 0).sum())
    step = max(1, block_bytes // (8 * 9 * x.element_size()))  # C*kh*kw values a point
    assert spans == [(lo, min(lo + step, points)) for lo in range(0, points, step)] and len(spans) >= 1
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert got.dtype == dtype and diff1(got, want.detach()) <= tol
    assert bool((got[:, :, _off_points(got, mask)] == 0).all())
    assert diff1(got, _dense(x, mask, weight, bias, 1)) <= tol
