"""Hypothesis fuzz of every op against its reference, valid and invalid input alike: for each drawn
call the reference and every cpu path either all raise the same cvops error or all return the same
result (bit-equal for pure-IO ops, diff1/diff2 <= 3e-3 for accumulating ones). Shapes are tiny and
the example counts small so the file runs in seconds; the op test files hold the deeper property tests."""
from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, event, given, settings, strategies as st

import cvops
import cvops.mmcv as mmcv
import cvops.spconv as spconv
import cvops.torchvision as tv
from cvops._core.errors import BadParamError, CvopsError, NotSupportedError
from cvops.metrics import bit_equal, diff1, diff2
from cvops.mmcv.psa_mask import psa_mask  # cvops.mmcv.psa_mask is the module, as mmcv.ops.psa_mask
from cvops.sparse import indice_conv
from tests.conftest import installed_cpu_paths

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
I64 = st.one_of(st.integers(-6, 8), st.sampled_from([-2**63, -2**63 + 1, -2**62, 2**62, 2**63 - 2, 2**63 - 1]))


def outcome(call):
    """``("ok", result)`` or ``(error type, None)`` for a cvops error; anything else propagates. A drop-in
    namespace's error that is also its peer's type (``BadParamError`` and ``RuntimeError``) counts as the
    cvops type it widens."""
    try:
        return "ok", call()
    except CvopsError as err:
        return next(t for t in type(err).__mro__ if t in (BadParamError, NotSupportedError, CvopsError)), None


def agree(call, same):
    """Run ``call(backend)`` on the reference and each cpu path; all outcomes must agree."""
    kind, expected = outcome(lambda: call("reference"))
    for path in installed_cpu_paths():
        got_kind, got = outcome(lambda: call(path))
        assert got_kind == kind, (path, got_kind, kind)
        if kind == "ok":
            assert same(got, expected), path
    event("accepted" if kind == "ok" else f"rejected: {kind.__name__}")
    return kind


def close(a, b):
    if isinstance(a, tuple):
        return all(close(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and a.dtype == b.dtype and (a.numel() == 0 or (diff1(a, b) <= 3e-3 and diff2(a, b) <= 3e-3))


def exact(a, b):
    if isinstance(a, tuple):
        return all(exact(x, y) for x, y in zip(a, b))
    return bit_equal(a, b)


@FUZZ
@given(n=st.integers(0, 2), c=st.integers(0, 12), h=st.integers(1, 5), w=st.integers(1, 5),
       hm=st.integers(-1, 4), wm=st.integers(1, 4), mode=st.sampled_from(["collect", "distribute", 1, "x"]),
       layout=st.sampled_from(["NCHW", "NHWC"]), special=st.booleans())
def test_psamask(n, c, h, w, hm, wm, mode, layout, special):
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    x = torch.randn(shape)
    if special and x.numel():
        x.view(-1)[0] = math.nan
    agree(lambda b: cvops.psamask(x, mode, (hm, wm), layout, backend=b), exact)
    dy = torch.randn((n, h * w, h, w) if layout == "NCHW" else (n, h, w, h * w))
    agree(lambda b: cvops.psamask_backward(dy, mode, (hm, wm), layout, backend=b), exact)


def _wrap64(v: int) -> int:
    return (v + 2**63) % 2**64 - 2**63


@FUZZ
@given(c=st.integers(1, 3), h=st.integers(1, 5), w=st.integers(1, 5), kh=st.sampled_from([1, 2, 3, 3, 0]),
       kw=st.integers(1, 3), pad_w=st.integers(-3, 3),
       pad_h=st.one_of(st.integers(-3, 3), st.sampled_from([-2**63, -2**63 + 1, 2**63 - 2, 2**63 - 1])),
       rows=st.lists(st.tuples(st.sampled_from([True, True, False]), I64, st.integers(-3, 3), st.integers(-4, 6)),
                     max_size=5),
       dtype=st.sampled_from([torch.int32, torch.int64, torch.int64]))
def test_masked_im2col(c, h, w, kh, kw, pad_h, pad_w, rows, dtype):
    # a row either draws its index freely or puts its window at offset r from the padding modulo 2**64:
    # in range when pad_h + r fits int64, and otherwise exactly the index whose int64 window wraps
    hs = [_wrap64(pad_h + r) if near else v for near, v, r, _ in rows]
    ws = [col for *_, col in rows]
    if dtype == torch.int32:
        hs = [max(min(v, 2**31 - 1), -2**31) for v in hs]
    feature = torch.randn(1, c, h, w)
    mh, mw = torch.tensor(hs, dtype=dtype), torch.tensor(ws, dtype=dtype)
    agree(lambda b: cvops.masked_im2col(feature, mh, mw, (kh, kw), (pad_h, pad_w), backend=b), exact)
    col = torch.randn(c, len(hs))
    agree(lambda b: cvops.masked_col2im(col, mh, mw, h, w, backend=b), exact)


@FUZZ
@given(n=st.integers(0, 2), cg=st.integers(1, 3), g=st.integers(1, 2), h=st.integers(1, 4), w=st.integers(1, 4),
       k=st.sampled_from([1, 3, 3, 5, 2, 0]), s=st.sampled_from([1, 2, 2, 3, 0]), dm=st.sampled_from([0] * 5 + [1]), layout=st.sampled_from(["NCHW", "NHWC"]))
def test_carafe(n, cg, g, h, w, k, s, dm, layout):
    c = cg * g + (1 if cg == 3 and g == 2 else 0)  # sometimes not divisible by g
    mk = max(k, 1)
    x = torch.randn(n, c, h, w)
    m = torch.rand(n, g * mk * mk, max(h * s, 1) + dm, max(w * s, 1))
    if layout == "NHWC":
        x, m = x.permute(0, 2, 3, 1).contiguous(), m.permute(0, 2, 3, 1).contiguous()
    kind = agree(lambda b: cvops.carafe_forward(x, m, k, g, s, layout, backend=b), close)
    if kind == "ok":
        gy = torch.randn_like(cvops.carafe_forward(x, m, k, g, s, layout, backend="reference"))
        agree(lambda b: cvops.carafe_backward(gy, x, m, k, g, s, layout, backend=b), close)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 2), h=st.integers(1, 6), w=st.integers(1, 6), p=st.integers(1, 3), od=st.integers(1, 2),
       rois=st.lists(st.tuples(st.integers(-1, 2), *[st.floats(-3, 9, allow_nan=False)] * 4), min_size=1, max_size=3),
       scale=st.sampled_from([0.5, 1.0, 0.0]))
def test_psroi_pool(n, h, w, p, od, rois, scale):
    x = torch.randn(n, p * p * od, h, w)
    boxes = torch.tensor([list(map(float, r)) for r in rois])
    agree(lambda b: cvops.psroi_pool(x, boxes, p, p, scale, p, od, backend=b), exact_or_close)


def exact_or_close(a, b):
    return close(a[0], b[0]) and torch.equal(a[1], b[1])


@settings(max_examples=15, deadline=None)
@given(coords=st.lists(st.tuples(st.integers(0, 1), st.integers(-1, 4), st.integers(0, 4), st.integers(0, 4)),
                       min_size=1, max_size=6, unique=True),
       k=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1), subm=st.booleans())
def test_get_indice_pairs(coords, k, stride, pad, subm):
    idx = torch.tensor(coords, dtype=torch.int32)
    stride = 1 if subm else stride
    agree(lambda b: cvops.get_indice_pairs(idx, 2, [4, 5, 5], k, stride, pad, 1, subm=subm, backend=b),
          lambda a, e: all(torch.equal(x, y) for x, y in zip(a, e)))


# ------------------------------------------------------------------------------------------ drop-in namespaces
# Each drawn call runs the drop-in entry point on every cpu path and cvops' own op on the reference backend;
# they must raise the same cvops error or give the same result.

@settings(max_examples=15, deadline=None)
@given(coords=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(0, 3), st.integers(0, 4)),
                       min_size=1, max_size=8, unique=True),
       cin=st.integers(1, 3), cout=st.integers(1, 3), k=st.sampled_from([1, 2, 3]), stride=st.integers(1, 2),
       pad=st.integers(0, 1), subm=st.booleans(), bias=st.booleans())
def test_spconv_layers(coords, cin, cout, k, stride, pad, subm, bias):
    torch.manual_seed(len(coords))
    layer = (spconv.SubMConv3d(cin, cout, k, bias=bias) if subm else
             spconv.SparseConv3d(cin, cout, k, stride=stride, padding=pad, bias=bias))
    if bias:
        torch.nn.init.normal_(layer.bias)
    idx, features = torch.tensor(coords, dtype=torch.int32), torch.randn(len(coords), cin)

    def run(backend):
        if backend != "reference":
            out = layer(spconv.SparseConvTensor(features, idx, [4, 4, 5], 2))
            return out.features, out.indices
        # cvops' functional sparse conv on the layer's weights, spconv's [out, *k, in] as [K, in, out]
        padding = k // 2 if subm else pad
        out_idx, pairs, num = cvops.get_indice_pairs(idx, 2, [4, 4, 5], k, 1 if subm else stride, padding, 1,
                                                      subm=subm, backend=backend)
        weight = layer.weight.detach().reshape(cout, k ** 3, cin).permute(1, 2, 0)
        out = indice_conv(features, weight, pairs, num, out_idx.shape[0], backend=backend,
                          identity_offset=k ** 3 // 2 if subm and k % 2 else -1)
        return (out if layer.bias is None else out + layer.bias).detach(), out_idx

    agree(run, lambda a, e: all(close(x, y) if x.is_floating_point() else torch.equal(x, y)
                                for x, y in zip(_by_site(*a), _by_site(*e))))


def _by_site(features, indices):
    """Rows in site order: a 1x1 layer keeps its input's row order (as spconv), the kernel map sorts."""
    order = indices.long().matmul(torch.tensor([8 ** 3, 8 ** 2, 8, 1])).argsort()
    return features.detach()[order], indices[order]


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 2), h=st.integers(1, 6), w=st.integers(1, 6), ph=st.integers(1, 3), pw=st.integers(1, 3),
       od=st.integers(1, 2), extra_channel=st.sampled_from([0, 0, 0, 1]),
       rois=st.lists(st.tuples(st.integers(-1, 2), *[st.floats(-3, 9, allow_nan=False)] * 4), min_size=1, max_size=3),
       scale=st.sampled_from([0.5, 1.0, 0.0, -1.0]), as_list=st.booleans())
def test_torchvision_ps_roi_pool(n, h, w, ph, pw, od, extra_channel, rois, scale, as_list):
    x = torch.randn(n, ph * pw * od + extra_channel, h, w)
    boxes = torch.tensor([list(map(float, r)) for r in rois])
    # a list of per-image Tensor[L, 4] where every batch index is valid; the same RoIs as Tensor[K, 5]
    as_list = as_list and all(0 <= r[0] < n for r in rois)
    if as_list:
        boxes = boxes[boxes[:, 0].argsort(stable=True)]
    per_image = [boxes[boxes[:, 0] == i, 1:] for i in range(n)]

    def run(backend):
        if backend != "reference":
            return tv.ps_roi_pool(x, per_image if as_list else boxes, (ph, pw), scale)
        return cvops.psroi_pool(x, boxes, ph, pw, scale, ph if ph == pw else 1, x.shape[1] // (ph * pw),
                                convention="torchvision", backend=backend)[0]

    agree(run, close)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 2), cg=st.integers(1, 3), g=st.integers(1, 2), h=st.integers(1, 4), w=st.integers(1, 4),
       k=st.sampled_from([1, 3, 3, 5, 2]), s=st.sampled_from([1, 2, 2, 3]), hm=st.integers(1, 4), wm=st.integers(0, 4),
       psa_type=st.sampled_from([0, 1, "collect", 2]), mask_channels=st.integers(-1, 0))
def test_mmcv_carafe_and_psa_mask(n, cg, g, h, w, k, s, hm, wm, psa_type, mask_channels):
    x = torch.randn(n, cg * g, h, w)
    m = torch.rand(n, g * k * k + mask_channels, h * s, w * s)
    agree(lambda b: cvops.carafe_forward(x, m, k, g, s, backend=b) if b == "reference" else
          mmcv.carafe(x, m, k, g, s), close)
    p = torch.randn(n, hm * max(wm, 1) + mask_channels, h, w)
    agree(lambda b: cvops.psamask(p, psa_type, (hm, wm), backend=b) if b == "reference" else
          psa_mask(p, psa_type, (hm, wm)), exact)
