"""masked_im2col / masked_col2im / MaskedConv2d: every layer against the loop reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import cvops
from cvops import mluops
from tests.support.cases import case_id, load_cases
from cvops._core.errors import BadParamError, Status
from cvops._core.jit import numba_enabled
from cvops.metrics import bit_equal, diff1, diff2
from cvops.ops.masked_im2col import cpu, reference
from tests.support.inputs.masked_im2col import case_inputs, case_mask
from tests.conftest import CPU_PATHS, installed_cpu_paths, requires_numba, requires_triton, select

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INDEX = [torch.int32, torch.int64]
UNIT = load_cases("masked_im2col", "unit")
SMALL = [c for c in UNIT if c["feature"][1] <= 8]


def ref_im2col(feature, h, w, kernel, pad):
    return reference.im2col_forward(feature, h, w, kernel[0], kernel[1], pad[0], pad[1])


def random_points(m, lo, hi, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(lo, hi, (m,), generator=gen).to(dtype),
            torch.randint(lo, hi, (m,), generator=gen).to(dtype))


def special_feature(shape, dtype, seed=0):
    """Random feature with NaN, +Inf, -Inf and -0.0 planted."""
    gen = torch.Generator().manual_seed(seed)
    f = torch.randn(shape, generator=gen).to(dtype)
    flat = f.view(-1)
    flat[::7] = float("nan")
    flat[3::11] = float("inf")
    flat[5::13] = float("-inf")
    flat[1::17] = -0.0
    return f


# ------------------------------------------------------------------------------------------ forward

@pytest.mark.parametrize("case", UNIT, ids=case_id)
def test_cpu_matches_reference_on_unit_cases(case, cpu_path):
    feature, h, w, kernel, pad = case_inputs(case)
    out = cvops.masked_im2col(feature, h, w, kernel, pad)
    assert out.shape == (feature.shape[1] * kernel[0] * kernel[1], h.shape[0])
    assert out.dtype == feature.dtype
    assert bit_equal(out, ref_im2col(feature, h, w, kernel, pad))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("index_dtype", INDEX)
@pytest.mark.parametrize("backend", [*CPU_PATHS, pytest.param("triton", marks=requires_triton)])
def test_bit_exact_all_dtypes_with_special_values(dtype, index_dtype, backend, monkeypatch):
    backend = select(backend, monkeypatch)
    feature = special_feature((1, 5, 7, 9), dtype)
    h, w = random_points(30, -4, 12, index_dtype)  # negative and out-of-range points
    for kernel, pad in [((3, 3), (1, 1)), ((1, 1), (0, 0)), ((2, 4), (0, 2)), ((9, 11), (1, 1))]:
        out = cvops.masked_im2col(feature, h, w, kernel, pad, backend=backend)
        expected = ref_im2col(feature, h, w, kernel, pad)
        assert bit_equal(out, expected), (kernel, pad)
    assert torch.isnan(out).any() and torch.isinf(out).any()


@requires_triton
@pytest.mark.parametrize("case", SMALL, ids=case_id)
def test_triton_matches_reference_on_small_unit_cases(case):
    feature, h, w, kernel, pad = case_inputs(case)
    assert bit_equal(cvops.masked_im2col(feature, h, w, kernel, pad, backend="triton"),
                     ref_im2col(feature, h, w, kernel, pad))


@requires_triton
def test_triton_doc_case_subsample():
    case = next(c for c in UNIT if c["name"] == "doc_case1_k3p1")
    feature, h, w, kernel, pad = case_inputs(case)
    feature, h, w = feature[:, :40], h[:70], w[:70]  # interpreter is slow: fewer channels and points
    assert bit_equal(cvops.masked_im2col(feature, h, w, kernel, pad, backend="triton"),
                     ref_im2col(feature, h, w, kernel, pad))


def test_non_contiguous_feature(cpu_path):
    base = torch.randn(1, 9, 8, 6).permute(0, 3, 1, 2)  # NHWC storage viewed as NCHW
    h, w = random_points(12, -2, 10, torch.int64)
    assert bit_equal(cvops.masked_im2col(base, h, w, 3, 1), ref_im2col(base, h, w, (3, 3), (1, 1)))
    # a sliced view (storage offset, channel and column steps), an expanded one (stride 0) and
    # strided index tensors
    big = special_feature((1, 12, 10, 15), torch.float16)
    h, w = random_points(40, -3, 13, torch.int32, seed=4)
    for view in (big[:, 1::3, 2:9, ::2], torch.randn(1, 1, 7, 5).expand(1, 6, 7, 5)):
        for kernel, pad in [((3, 3), (1, 1)), ((2, 5), (0, 3)), ((9, 2), (1, 0))]:
            assert bit_equal(cvops.masked_im2col(view, h[::2], w[1::2], kernel, pad),
                             ref_im2col(view, h[::2], w[1::2], kernel, pad)), (view.stride(), kernel)


@requires_numba
def test_numba_path_is_taken_and_switchable(monkeypatch):
    from cvops._core.jit import numba_kernels
    feature, h, w = torch.randn(1, 2, 4, 4), torch.tensor([1]), torch.tensor([2])
    monkeypatch.setenv("CVOPS_NUMBA", "1")
    assert numba_kernels(cpu.__package__, feature, h, w) is not None
    monkeypatch.setenv("CVOPS_NUMBA", "0")
    assert numba_kernels(cpu.__package__, feature, h, w) is None


@requires_numba
@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("dtype", FLOATS)
def test_numba_streaming_and_cached_stores_agree(dtype, streaming, monkeypatch):
    """The numba kernel writes large outputs with streaming stores, small ones with plain stores: both
    exact for every dtype, on interior and border points, serial and parallel."""
    from cvops.ops.masked_im2col import cpu_numba
    monkeypatch.setenv("CVOPS_NUMBA", "1")
    monkeypatch.setattr(cpu_numba, "STREAM_MIN_BYTES", 0 if streaming else 1 << 62)
    for shape, m in [((1, 5, 7, 9), 30), ((1, 64, 20, 24), 400)]:  # serial and parallel sizes
        feature = special_feature(shape, dtype)
        h, w = random_points(m, -3, 26, torch.int64, seed=m)
        for kernel, pad in [((3, 3), (1, 1)), ((1, 2), (0, 0)), ((11, 12), (2, 2))]:
            assert bit_equal(cvops.masked_im2col(feature, h, w, kernel, pad),
                             ref_im2col(feature, h, w, kernel, pad)), (shape, kernel)


def test_result_does_not_depend_on_thread_count(cpu_path):
    case = next(c for c in load_cases("masked_im2col", "network") if c["name"] == "retinanet_head_k3p1")
    feature, h, w, kernel, pad = case_inputs(case)
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(cvops.masked_im2col(feature, h, w, kernel, pad).clone())
    finally:
        torch.set_num_threads(threads)
    assert bit_equal(outs[0], outs[1]) and bit_equal(outs[0], outs[2])


def test_reference_matches_formula_by_hand():
    feature = torch.arange(1 * 2 * 3 * 3, dtype=torch.float32).view(1, 2, 3, 3)
    out = cvops.masked_im2col(feature, torch.tensor([0, 2]), torch.tensor([0, 5]), 2, 1)
    # point (0, 0), window rows -1..0, cols -1..0: only tap (1, 1) is inside -> feature[c, 0, 0]
    assert out[:, 0].tolist() == [0, 0, 0, 0.0, 0, 0, 0, 9.0]
    # point (2, 5): cols 4..5 are outside the 3-wide feature -> all zeros
    assert out[:, 1].tolist() == [0.0] * 8


# the GA-RetinaNet loc cases gather the same columns as their cls twins
@pytest.mark.parametrize("case", [c for c in load_cases("masked_im2col", "network") if "_loc_" not in c["name"]],
                         ids=case_id)
def test_network_cases_cpu_vs_reference_subsample(case, cpu_path):
    feature, h, w, kernel, pad = case_inputs(case)
    out = cvops.masked_im2col(feature, h, w, kernel, pad)
    assert out.shape == (feature.shape[1] * kernel[0] * kernel[1], h.shape[0])
    # columns are independent: check a spread of points against the loop reference
    pick = torch.linspace(0, h.shape[0] - 1, 150).long().unique()
    assert bit_equal(out[:, pick], ref_im2col(feature, h[pick], w[pick], kernel, pad))
    # invariant: the tap at the window's own point (when inside the window) copies the point
    i, j = pad
    if 0 <= i < kernel[0] and 0 <= j < kernel[1]:
        rows = torch.arange(feature.shape[1]) * kernel[0] * kernel[1] + i * kernel[1] + j
        inside = (h >= 0) & (h < feature.shape[2]) & (w >= 0) & (w < feature.shape[3])
        assert bit_equal(out[rows][:, inside], feature[0][:, h[inside].long(), w[inside].long()])


@settings(max_examples=25, deadline=None)
@given(c=st.integers(1, 4), hh=st.integers(1, 7), ww=st.integers(1, 7), kh=st.integers(1, 5),
       kw=st.integers(1, 5), ph=st.integers(-2, 3), pw=st.integers(-2, 3), m=st.integers(0, 12),
       seed=st.integers(0, 2**16))
def test_hypothesis_cpu_vs_reference(c, hh, ww, kh, kw, ph, pw, m, seed):
    gen = torch.Generator().manual_seed(seed)
    feature = torch.randn(1, c, hh, ww, generator=gen)
    h = torch.randint(-6, hh + 6, (m,), generator=gen)
    w = torch.randint(-6, ww + 6, (m,), generator=gen).int()
    expected = ref_im2col(feature, h, w, (kh, kw), (ph, pw))
    for path in installed_cpu_paths():
        with pytest.MonkeyPatch.context() as monkeypatch:
            select(path, monkeypatch)
            assert bit_equal(cvops.masked_im2col(feature, h, w, (kh, kw), (ph, pw)), expected), path
    out = torch.randn(c, m, generator=gen)
    assert bit_equal(cvops.masked_col2im(out, h, w, hh, ww), reference.col2im_forward(out, h, w, hh, ww))


# ------------------------------------------------------------------------------------------ zero elements

@pytest.mark.parametrize("backend", ["reference", *CPU_PATHS, pytest.param("triton", marks=requires_triton)])
def test_zero_mask_points_gives_empty_columns(backend, monkeypatch):
    backend = select(backend, monkeypatch)
    feature = torch.randn(1, 3, 4, 4)
    empty = torch.empty(0, dtype=torch.int32)
    out = cvops.masked_im2col(feature, empty, empty, (2, 3), 1, backend=backend)
    assert out.shape == (18, 0) and out.dtype == feature.dtype
    back = cvops.masked_col2im(torch.empty(5, 0), empty, empty, 4, 3, backend=backend)
    assert back.shape == (1, 5, 4, 3) and not back.any()


@pytest.mark.parametrize("shape", [(1, 0, 4, 4), (1, 3, 0, 4), (1, 3, 4, 0)])
def test_empty_feature_is_bad_param(shape):
    with pytest.raises(BadParamError, match="feature must not be empty"):
        cvops.masked_im2col(torch.empty(shape), torch.tensor([0]), torch.tensor([0]), 3, 1)


def test_col2im_empty_map_drops_every_point():
    out = cvops.masked_col2im(torch.randn(2, 3), torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]), 0, 5)
    assert out.shape == (1, 2, 0, 5)


# ------------------------------------------------------------------------------------------ bad parameters

GOOD_IDX = torch.tensor([0, 1])


@pytest.mark.parametrize("args, match", [
    ((torch.randn(1, 2, 3), GOOD_IDX, GOOD_IDX, 3, 1), "feature must be 4-D"),
    ((torch.randn(2, 2, 3, 3), GOOD_IDX, GOOD_IDX, 3, 1), "batch"),
    ((torch.zeros(1, 2, 3, 3, dtype=torch.int32), GOOD_IDX, GOOD_IDX, 3, 1), "feature dtype"),
    ((torch.randn(1, 2, 3, 3), GOOD_IDX.float(), GOOD_IDX, 3, 1), "mask_h_idx dtype"),
    ((torch.randn(1, 2, 3, 3), GOOD_IDX, GOOD_IDX.to(torch.int16), 3, 1), "mask_w_idx dtype"),
    ((torch.randn(1, 2, 3, 3), GOOD_IDX.view(1, 2), GOOD_IDX, 3, 1), "mask_h_idx must be 1-D"),
    ((torch.randn(1, 2, 3, 3), GOOD_IDX, torch.tensor([0, 1, 2]), 3, 1), "one length"),
    ((torch.randn(1, 2, 3, 3), GOOD_IDX, GOOD_IDX, 0, 1), "kernel_size must be >= 1"),
    ((torch.randn(1, 2, 3, 3), GOOD_IDX, GOOD_IDX, (3, -1), 1), "kernel_size must be >= 1"),
    ((torch.randn(1, 2, 3, 3), GOOD_IDX, GOOD_IDX, (3, 3, 3), 1), "kernel_size must be an int or 2 ints"),
    ((torch.randn(1, 2, 3, 3), GOOD_IDX, GOOD_IDX, 2.5, 1), "kernel_size must be an int"),
    ((torch.randn(1, 2, 3, 3), GOOD_IDX, GOOD_IDX, 3, 1.0), "padding must be an int"),
    (("feature", GOOD_IDX, GOOD_IDX, 3, 1), "feature must be a torch.Tensor"),
])
def test_im2col_bad_parameters(args, match):
    with pytest.raises(BadParamError, match=match) as err:
        cvops.masked_im2col(*args)
    assert err.value.status == Status.BAD_PARAM and isinstance(err.value, ValueError)


def test_bad_backend():
    with pytest.raises(BadParamError, match="backend must be one of"):
        cvops.masked_im2col(torch.randn(1, 2, 3, 3), GOOD_IDX, GOOD_IDX, 3, 1, backend="cuda")


@pytest.mark.parametrize("args, match", [
    ((torch.randn(2), GOOD_IDX, GOOD_IDX, 3, 3), "masked_output must be 2-D"),
    ((torch.randn(2, 3), GOOD_IDX, GOOD_IDX, 3, 3), r"masked_output dim 1 \(3\) must equal"),
    ((torch.randn(2, 2), GOOD_IDX, GOOD_IDX, -1, 3), "height must be >= 0"),
    ((torch.randn(2, 2), GOOD_IDX, GOOD_IDX, 3, 2.0), "width must be an int"),
    ((torch.randn(2, 2).int(), GOOD_IDX, GOOD_IDX, 3, 3), "masked_output dtype"),
    ((torch.randn(2, 2), GOOD_IDX.double(), GOOD_IDX, 3, 3), "mask_h_idx dtype"),
])
def test_col2im_bad_parameters(args, match):
    with pytest.raises(BadParamError, match=match):
        cvops.masked_col2im(*args)


# ------------------------------------------------------------------------------------------ col2im

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("backend", ["cpu", pytest.param("triton", marks=requires_triton)])
def test_col2im_bit_exact_with_duplicates_and_outside_points(dtype, backend):
    h = torch.tensor([0, 2, 2, -1, 5, 4, 0, 3], dtype=torch.int32)
    w = torch.tensor([0, 1, 1, 0, 0, 3, 0, 9], dtype=torch.int32)
    src = special_feature((1, 1, 3, 8), dtype).view(3, 8)
    out = cvops.masked_col2im(src, h, w, 5, 4, backend=backend)
    assert bit_equal(out, reference.col2im_forward(src, h, w, 5, 4))
    assert bit_equal(out[0, :, 0, 0], src[:, 6])  # the later duplicate wins
    assert bit_equal(out[0, :, 2, 1], src[:, 2])
    grad = special_feature((1, 3, 5, 4), dtype, seed=1)
    mod = cpu if backend == "cpu" else pytest.importorskip("cvops.ops.masked_im2col.triton")
    assert bit_equal(mod.col2im_backward(grad, h, w), reference.col2im_backward(grad, h, w))


# ------------------------------------------------------------------------------------------ autograd

def test_gradcheck_im2col_and_col2im_float64():
    feature = torch.randn(1, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    h = torch.tensor([0, 2, 2, -1, 4, 6, 1, 3])  # duplicates, partial and empty windows
    w = torch.tensor([0, 1, 1, 0, 3, 1, -2, 3], dtype=torch.int32)
    assert torch.autograd.gradcheck(lambda f: cvops.masked_im2col(f, h, w, (3, 2), (1, 0)), (feature,))
    assert torch.autograd.gradgradcheck(lambda f: cvops.masked_im2col(f, h, w, (3, 2), (1, 0)), (feature,))
    cols = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: cvops.masked_col2im(x, h, w, 5, 4), (cols,))
    assert torch.autograd.gradgradcheck(lambda x: cvops.masked_col2im(x, h, w, 5, 4), (cols,))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("backend", [*CPU_PATHS, pytest.param("triton", marks=requires_triton)])
def test_im2col_backward_vs_reference(dtype, backend, monkeypatch):
    backend = select(backend, monkeypatch)
    h, w = random_points(40, -3, 9, torch.int64, seed=3)  # many duplicates
    feature = torch.randn(1, 4, 6, 5).to(dtype).requires_grad_()
    out = cvops.masked_im2col(feature, h, w, (3, 4), (1, 2), backend=backend)
    grad_col = torch.randn(out.shape).to(dtype)
    (grad,) = torch.autograd.grad(out, feature, grad_col)
    expected = reference.im2col_backward(grad_col, h, w, 4, 6, 5, 3, 4, 1, 2)
    assert grad.dtype == dtype
    assert diff1(grad, expected) <= (1e-12 if dtype == torch.float64 else 3e-3)
    assert diff2(grad, expected) <= (1e-12 if dtype == torch.float64 else 3e-3)
    # determinism: the same bits on a second run
    (again,) = torch.autograd.grad(cvops.masked_im2col(feature, h, w, (3, 4), (1, 2), backend=backend),
                                   feature, grad_col)
    assert bit_equal(grad, again)


def test_im2col_col2im_are_adjoint():
    """<im2col(x), y> == <x, im2col_backward(y)> and <col2im(c), g> == <c, col2im_backward(g)>."""
    h, w = random_points(30, -3, 9, torch.int64, seed=5)
    x = torch.randn(1, 3, 6, 7, dtype=torch.float64)
    y = torch.randn(3 * 6, 30, dtype=torch.float64)
    lhs = (cvops.masked_im2col(x, h, w, (2, 3), 1) * y).sum()
    rhs = (x * cpu.im2col_backward(y, h, w, 3, 6, 7, 2, 3, 1, 1)).sum()
    assert torch.allclose(lhs, rhs, rtol=1e-12, atol=1e-12)
    c = torch.randn(3, 30, dtype=torch.float64)
    g = torch.randn(1, 3, 6, 7, dtype=torch.float64)
    assert torch.allclose((cvops.masked_col2im(c, h, w, 6, 7) * g).sum(), (c * cpu.col2im_backward(g, h, w)).sum(),
                          rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------ MaskedConv2d

def _dense_masked(module, x, mask):
    return F.conv2d(x, module.weight, module.bias, padding=module.padding) * (mask > 0)


@pytest.mark.parametrize("bias", [True, False])
def test_masked_conv2d_matches_dense_conv_times_mask(bias, cpu_path):
    torch.manual_seed(0)
    module = cvops.nn.MaskedConv2d(3, 4, 3, padding=1, bias=bias).double()
    x = torch.randn(1, 3, 16, 16, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(1, 16, 16) > 0.5).double()
    out = module(x, mask)
    expected = _dense_masked(module, x, mask)
    assert out.shape == (1, 4, 16, 16)
    assert torch.allclose(out, expected, rtol=1e-12, atol=1e-12)
    assert bool((out[:, :, mask[0] == 0] == 0).all())  # no bias outside the mask
    if bias:
        assert bool((out[:, :, mask[0] > 0] != 0).any())
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x] + list(module.parameters()), grad)
    want = torch.autograd.grad(expected, [x] + list(module.parameters()), grad)
    for g, e in zip(got, want):
        assert torch.allclose(g, e, rtol=1e-10, atol=1e-10)


def test_masked_conv2d_gradcheck():
    torch.manual_seed(1)
    x = torch.randn(1, 2, 5, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 2, 3, 2, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(1, 5, 6) > 0.4).float()
    assert torch.autograd.gradcheck(lambda a, b, c: cvops.masked_conv2d(a, mask, b, c, padding=(1, 0)),
                                    (x, weight, bias))


def test_masked_conv2d_float32_network_scale_kernel_and_unmasked_path():
    case = next(c for c in UNIT if c["name"] == "mmcv_test_masked_conv2d")
    feature, h, w, kernel, pad = case_inputs(case)
    mask = case_mask(case, h, w)
    module = cvops.nn.MaskedConv2d(3, 3, 3, 1, 1)
    out = module(feature, mask)
    assert diff1(out, _dense_masked(module, feature, mask)) <= 1e-5
    assert torch.equal(module(feature), F.conv2d(feature, module.weight, module.bias, padding=1))


def test_masked_conv2d_inference_path_agrees_with_training_path():
    """Under no_grad and with grads (the custom ops' backward in the graph) the same values."""
    torch.manual_seed(4)
    module = cvops.nn.MaskedConv2d(16, 8, 3, padding=1)
    x = torch.randn(1, 16, 20, 24)
    mask = (torch.rand(1, 20, 24) > 0.7).float()
    with torch.no_grad():
        fast = module(x, mask)
    train = module(x, mask)
    dense = _dense_masked(module, x, mask)
    assert fast.shape == train.shape == (1, 8, 20, 24)
    assert bool((fast[:, :, mask[0] == 0] == 0).all())
    for out in (fast, train):
        assert diff1(out, dense) <= 1e-5 and diff2(out, dense) <= 1e-5
    with torch.no_grad():
        no_bias = cvops.masked_conv2d(x, mask, module.weight, None, 1)
    assert diff1(no_bias, _dense_masked(module, x, mask) - module.bias[:, None, None] * (mask > 0)) <= 1e-5


def test_masked_conv2d_all_zero_mask_gives_zeros_and_zero_grads():
    module = cvops.nn.MaskedConv2d(2, 3, 3, padding=1)
    x = torch.randn(1, 2, 4, 4, requires_grad=True)
    out = module(x, torch.zeros(1, 4, 4))
    assert out.shape == (1, 3, 4, 4) and not out.any()
    out.sum().backward()
    assert not x.grad.any() and not module.weight.grad.any() and not module.bias.grad.any()


def test_masked_conv2d_bad_parameters():
    x, mask = torch.randn(1, 2, 5, 5), torch.ones(1, 5, 5)
    with pytest.raises(ValueError, match="stride must be 1"):
        cvops.nn.MaskedConv2d(2, 3, 3, stride=2, padding=1)(x, mask)
    with pytest.raises(BadParamError, match="dilation must be 1"):
        cvops.nn.MaskedConv2d(2, 3, 3, dilation=2, padding=1)(x, mask)
    with pytest.raises(BadParamError, match="groups must be 1"):
        cvops.nn.MaskedConv2d(2, 4, 3, groups=2, padding=1)(x, mask)
    with pytest.raises(BadParamError, match="input batch"):
        cvops.nn.MaskedConv2d(2, 3, 3, padding=1)(torch.randn(2, 2, 5, 5), mask)
    with pytest.raises(BadParamError, match="mask spatial size"):
        cvops.nn.MaskedConv2d(2, 3, 3, padding=1)(x, torch.ones(1, 4, 5))
    with pytest.raises(BadParamError, match="output size"):
        cvops.nn.MaskedConv2d(2, 3, 7)(x, mask)
    with pytest.raises(BadParamError, match="input channels"):
        cvops.nn.MaskedConv2d(3, 3, 3)(x, mask)


def test_masked_conv2d_torch_compile():
    torch.manual_seed(2)
    module = cvops.nn.MaskedConv2d(2, 3, 3, padding=1)
    x = torch.randn(1, 2, 6, 6, requires_grad=True)
    mask = (torch.rand(1, 6, 6) > 0.5).float()
    h, w = torch.nonzero(mask[0] > 0, as_tuple=True)

    def head(feat):  # the graph-breaking nonzero stays outside; the custom ops are traced
        cols = cvops.masked_im2col(feat, h, w, 3, 1)
        return cvops.masked_col2im(module.weight.view(3, -1) @ cols + module.bias[:, None], h, w, 6, 6)

    compiled = torch.compile(head, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    assert torch.allclose(out, module(x, mask), rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@requires_triton
def test_masked_conv2d_triton_backend_matches_cpu():
    torch.manual_seed(3)
    x = torch.randn(1, 3, 6, 5)
    weight, bias = torch.randn(4, 3, 3, 3), torch.randn(4)
    mask = (torch.rand(1, 6, 5) > 0.5).float()
    a = cvops.masked_conv2d(x, mask, weight, bias, 1, backend="triton")
    b = cvops.masked_conv2d(x, mask, weight, bias, 1, backend="cpu")  # the cpu route: its own sum order
    assert torch.equal(a == 0, b == 0) and torch.allclose(a, b, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ int64 limits
I64_MIN, I64_MAX = -2**63, 2**63 - 1


@pytest.mark.parametrize("path", [*CPU_PATHS, pytest.param("triton", marks=requires_triton), "reference"])
def test_padding_that_would_overflow_int64_is_rejected(path, monkeypatch):
    # 2**63 - 1 - (-2**63) wraps to -1 in int64 arithmetic; the next tap would then read column 0
    feature = torch.randn(1, 2, 3, 3)
    idx = torch.tensor([I64_MAX], dtype=torch.int64)
    backend = select(path, monkeypatch)
    for kernel, pad in (((2, 2), (I64_MIN, I64_MIN)), ((3, 3), (0, I64_MIN)), ((1, 1), (2**64, 0)),
                        ((3, 3), (2**63 - 5, 0))):
        with pytest.raises(BadParamError, match=r"padding .* must be < 2\*\*63"):
            cvops.masked_im2col(feature, idx, idx, kernel, pad, backend=backend)


@pytest.mark.parametrize("path", [*CPU_PATHS, pytest.param("triton", marks=requires_triton)])
def test_extreme_indices_within_the_padding_limit_match_the_reference(path, monkeypatch):
    # every accepted (index, padding) pair gives the reference's exact result: window coordinates
    # near +-2**63 never wrap into the feature
    feature = special_feature((1, 2, 3, 4), torch.float32)
    values = [I64_MIN, I64_MIN + 1, -2**62, -1, 0, 1, 2, 2**62, I64_MAX - 1, I64_MAX]
    h = torch.tensor([v for v in values for _ in values], dtype=torch.int64)
    w = torch.tensor([v for _ in values for v in values], dtype=torch.int64)
    backend = select(path, monkeypatch)
    for kernel in ((1, 1), (3, 2)):
        limit_h, limit_w = 2**63 - 1 - kernel[0] - 3, 2**63 - 1 - kernel[1] - 4  # the largest accepted |pad|
        for pad in ((0, 0), (1, -1), (limit_h, limit_w), (-limit_h, -limit_w), (limit_h, -limit_w)):
            expected = ref_im2col(feature, h, w, kernel, pad)
            actual = cvops.masked_im2col(feature, h, w, kernel, pad, backend=backend)
            assert bit_equal(actual, expected), (kernel, pad)


def test_mluops_overflowing_padding_is_bad_param():
    feature = torch.randn(1, 2, 3, 3)
    idx = torch.tensor([2**31 - 1], dtype=torch.int32)
    data_col = torch.zeros(2 * 9, 1)
    handle = mluops.create_handle()
    status = mluops.masked_im2col_forward(
        handle, mluops.descriptor_of(feature, mluops.Layout.NCHW), feature, mluops.descriptor_of(idx), idx,
        mluops.descriptor_of(idx), idx, 3, 3, -2**63, 0, None, 0, mluops.descriptor_of(data_col), data_col)
    assert status == Status.BAD_PARAM and "pad_h" in handle.last_error


@pytest.mark.parametrize("change, error, fragment", [
    (dict(bias=torch.zeros(4)), BadParamError, r"bias must have out_channels \(3\) elements"),
    (dict(bias=torch.zeros(1, 3)), BadParamError, "bias must be 1-D"),
    (dict(bias=[0.0, 0.0, 0.0]), BadParamError, "bias must be a torch.Tensor"),
    (dict(bias=torch.zeros(3, dtype=torch.float64)), BadParamError, "bias dtype"),
    (dict(weight=torch.zeros(3, 2, 3)), BadParamError, "weight must be 4-D"),
    (dict(weight=torch.zeros(3, 2, 3, 3, 1)), BadParamError, "weight must be 4-D"),
    (dict(weight="w"), BadParamError, "weight must be a torch.Tensor"),
    (dict(weight=torch.zeros(3, 2, 3, 3, dtype=torch.float64)), BadParamError, "weight dtype"),
    (dict(weight=torch.zeros(0, 2, 3, 3), bias=None), BadParamError, "weight out_channels"),
    (dict(weight=torch.zeros(3, 2, 0, 3)), BadParamError, "weight kernel size"),
    (dict(mask=torch.ones(1, 5, 5, dtype=torch.complex64)), BadParamError, "mask dtype"),
    (dict(mask=None), BadParamError, "mask must be a torch.Tensor"),
    (dict(features=torch.ones(1, 2, 5, 5, dtype=torch.int32)), BadParamError, "input dtype"),
    (dict(padding=-1), BadParamError, "padding must be >= 0"),
    (dict(padding="1"), BadParamError, "padding must be an int"),
    (dict(groups=1.5), BadParamError, "groups must be an int"),
])
def test_masked_conv2d_every_argument_checked_before_use(change, error, fragment):
    args = dict(features=torch.randn(1, 2, 5, 5), mask=torch.ones(1, 5, 5), weight=torch.randn(3, 2, 3, 3),
                bias=torch.zeros(3), padding=1)
    args.update(change)
    with pytest.raises(error, match=fragment):
        cvops.masked_conv2d(**args)
