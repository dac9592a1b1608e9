"""psamask: every layer bit-exact against the doc's loops, checks, autograd, compile, MLU-OPS layer."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st

import cvops
from cvops import mluops
from cvops._core.cases import case_id, load_cases
from cvops._core.errors import BadParamError, NotSupportedError, Status
from cvops._core.metrics import bit_equal, diff3
from tests.conftest import requires_triton

MODES = ("collect", "distribute")
LAYOUTS = ("NCHW", "NHWC")
FAST_BACKENDS = ["cpu", pytest.param("triton", marks=requires_triton)]


def make(n, h, w, c, layout, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def run_case(backend, n, h, w, hm, wm, mode, layout, dtype=torch.float32):
    x = make(n, h, w, hm * wm, layout, dtype)
    dy = make(n, h, w, h * w, layout, dtype, seed=1)
    for fn, t in ((cvops.psamask_forward, x), (cvops.psamask_backward, dy)):
        expected = fn(t, mode, (hm, wm), layout, backend="reference")
        actual = fn(t, mode, (hm, wm), layout, backend=backend)
        assert bit_equal(actual, expected), (fn.__name__, backend, n, h, w, hm, wm, mode, layout)
        assert diff3(actual, expected) == 0


# -------------------------------------------------------------------------------- the semantics itself
def test_hand_computed_collect_and_distribute():
    # 2x2 feature, 3x3 mask (psamask.md 3.1): hh = hw = 1, out[q, p] = x[(qh-ph+1)*3 + (qw-pw+1), p].
    x = torch.arange(9 * 4, dtype=torch.float32).view(1, 9, 2, 2)
    out = cvops.psamask(x, "collect", 3, backend="reference")
    expected = torch.zeros(1, 4, 2, 2)
    for qh, qw, ph, pw in itertools.product(range(2), repeat=4):
        expected[0, qh * 2 + qw, ph, pw] = x[0, (qh - ph + 1) * 3 + (qw - pw + 1), ph, pw]
    assert torch.equal(out, expected)
    assert out[0, 3, 0, 0] == x[0, 8, 0, 0]  # neighbour (1,1) of (0,0) is mask tap (2,2)
    dist = cvops.psamask(x, "distribute", 3, backend="reference")
    assert torch.equal(dist, expected.view(1, 4, 4).transpose(1, 2).reshape(1, 4, 2, 2))


def test_even_mask_window_is_asymmetric():
    # h_mask = 4: offsets -1..+2 (semantics.md 1). Position (0,0) sees neighbours up to (2, 0).
    x = torch.ones(1, 4 * 1, 4, 1)
    out = cvops.psamask(x, "collect", (4, 1), backend="reference")[0, :, 0, 0]
    assert out.tolist() == [1.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_distribute_is_collect_transposed(layout):
    x = make(2, 5, 6, 7 * 5, layout)
    col = cvops.psamask(x, "collect", (7, 5), layout)
    dist = cvops.psamask(x, "distribute", (7, 5), layout)
    if layout == "NHWC":
        col, dist = col.permute(0, 3, 1, 2), dist.permute(0, 3, 1, 2)
    assert torch.equal(col.reshape(2, 30, 30).transpose(1, 2), dist.reshape(2, 30, 30))


# -------------------------------------------------------------------------------- layers vs reference
@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("case", load_cases("psamask", "unit"), ids=case_id)
def test_unit_cases_all_modes_and_layouts(backend, case):
    for mode, layout in itertools.product(MODES, LAYOUTS):
        if backend == "triton" and case["N"] * case["H"] * case["W"] > 2000:
            pytest.skip("interpreter: small shapes only")
        run_case(backend, case["N"], case["H"], case["W"], case["h_mask"], case["w_mask"], mode, layout)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_float_dtype_bit_exact(backend, dtype):
    for mode, layout in itertools.product(MODES, LAYOUTS):
        run_case(backend, 2, 4, 5, 3, 4, mode, layout, dtype)


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_nan_inf_and_payloads_copied_bit_exact(backend):
    x = make(1, 4, 4, 9, "NCHW")
    x[0, 4, 1, 1] = float("nan")
    x[0, 3, 2, 2] = float("inf")
    x[0, 5, 0, 1] = float("-inf")
    x.view(torch.int32)[0, 0, 1, 1] = 0x7FC00123  # a NaN with a payload
    for mode in MODES:
        expected = cvops.psamask(x, mode, 3, backend="reference")
        actual = cvops.psamask(x, mode, 3, backend=backend)
        assert bit_equal(actual, expected)
        assert torch.isnan(actual).any() and torch.isinf(actual).any()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), h=st.integers(1, 7), w=st.integers(1, 7), hm=st.integers(1, 15),
       wm=st.integers(1, 15), mode=st.sampled_from(MODES), layout=st.sampled_from(LAYOUTS))
def test_property_cpu_matches_reference(n, h, w, hm, wm, mode, layout):
    run_case("cpu", n, h, w, hm, wm, mode, layout)


@requires_triton
@settings(max_examples=8, deadline=None)
@given(h=st.integers(1, 5), w=st.integers(1, 5), hm=st.integers(1, 9), wm=st.integers(1, 9),
       mode=st.sampled_from(MODES), layout=st.sampled_from(LAYOUTS))
def test_property_triton_matches_reference(h, w, hm, wm, mode, layout):
    run_case("triton", 1, h, w, hm, wm, mode, layout)


def test_non_contiguous_input():
    x = make(2, 6, 5, 9 * 2, "NCHW")[:, ::2]  # channel stride 2 * H * W
    assert not x.is_contiguous()
    for mode in MODES:
        assert bit_equal(cvops.psamask(x, mode, 3), cvops.psamask(x.contiguous(), mode, 3, backend="reference"))


# -------------------------------------------------------------------------------- network scale
@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in load_cases("psamask", "network") if c["N"] <= 2], ids=case_id)
def test_network_scale_cpu_matches_reference(case):
    run_case("cpu", 1, case["H"], case["W"], case["h_mask"], case["w_mask"], case["psa_type"], case["layout"])


# -------------------------------------------------------------------------------- zero elements
@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_elements_return_empty(backend, layout):
    x = make(0, 3, 4, 9, layout)
    out = cvops.psamask(x, "collect", 3, layout, backend=backend)
    assert out.shape == ((0, 12, 3, 4) if layout == "NCHW" else (0, 3, 4, 12))
    dy = make(2, 0, 4, 0, layout)
    dx = cvops.psamask_backward(dy, "distribute", 3, layout, backend=backend)
    assert dx.shape == ((2, 9, 0, 4) if layout == "NCHW" else (2, 0, 4, 9))


# -------------------------------------------------------------------------------- bad parameters
@pytest.mark.parametrize("psa_type", ["bi-direction", 2, -1, True, None, 0.0])
def test_bad_psa_type(psa_type):
    with pytest.raises(BadParamError, match="psa_type"):
        cvops.psamask(torch.zeros(1, 9, 3, 3), psa_type, 3)
    with pytest.raises(ValueError):
        cvops.nn.PSAMask(psa_type, (3, 3))


@pytest.mark.parametrize("mask_size,rule", [(0, ">= 1"), (-3, ">= 1"), ((3,), "2 ints"), ((3, 3, 3), "2 ints"),
                                            (3.0, "int"), ("3", "int")])
def test_bad_mask_size(mask_size, rule):
    with pytest.raises(BadParamError, match="mask_size") as err:
        cvops.psamask(torch.zeros(1, 9, 3, 3), "collect", mask_size)
    assert rule in str(err.value)


def test_bad_input():
    with pytest.raises(BadParamError, match=r"input channels \(15\) must equal h_mask \* w_mask"):
        cvops.psamask(torch.zeros(1, 15, 3, 3), "collect", 4)
    with pytest.raises(BadParamError, match="input must be 4-D"):
        cvops.psamask(torch.zeros(9, 3, 3), "collect", 3)
    with pytest.raises(BadParamError, match="dtype"):
        cvops.psamask(torch.zeros(1, 9, 3, 3, dtype=torch.int32), "collect", 3)
    with pytest.raises(BadParamError, match="torch.Tensor"):
        cvops.psamask([[1.0]], "collect", 3)
    with pytest.raises(BadParamError, match="layout"):
        cvops.psamask(torch.zeros(1, 9, 3, 3), "collect", 3, layout="NCWH")
    with pytest.raises(BadParamError, match=r"grad_output channels \(8\) must equal h_feature \* w_feature"):
        cvops.psamask_backward(torch.zeros(1, 8, 3, 3), "collect", 3)
    with pytest.raises(BadParamError, match="backend"):
        cvops.psamask(torch.zeros(1, 9, 3, 3), "collect", 3, backend="gpu")


def test_triton_backend_without_gpu_or_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    from cvops._core.dispatch import triton_available
    if not triton_available():
        pytest.skip("triton not installed")
    with pytest.raises(NotSupportedError, match="CUDA"):
        cvops.psamask(torch.zeros(1, 9, 3, 3), "collect", 3, backend="triton")


# -------------------------------------------------------------------------------- autograd and compile
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradcheck_and_gradgradcheck(mode, layout):
    x = make(2, 3, 4, 3 * 5, layout, torch.float64).requires_grad_()
    fn = lambda t: cvops.psamask(t, mode, (3, 5), layout)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


def test_autograd_equals_explicit_backward():
    x = make(2, 4, 4, 9, "NCHW").requires_grad_()
    dy = make(2, 4, 4, 16, "NCHW", seed=3)
    cvops.psamask(x, "distribute", 3).backward(dy)
    assert bit_equal(x.grad, cvops.psamask_backward(dy, "distribute", 3, backend="reference"))


def test_module_under_torch_compile():
    module = cvops.nn.PSAMask("collect", (3, 3))
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    x = make(1, 4, 5, 9, "NCHW").requires_grad_()
    out = compiled(x)
    assert bit_equal(out, module(x))
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_module_matches_mmcv_signature():
    m = cvops.nn.PSAMask("distribute", mask_size=(5, 3))
    x = make(1, 4, 6, 15, "NCHW")
    assert bit_equal(m(x), cvops.psamask(x, 1, (5, 3), backend="reference"))
    assert "distribute" in repr(m)


# -------------------------------------------------------------------------------- MLU-OPS layer
def _nhwc_call(fn, psa_type=0, n=1, h=4, w=4, hm=3, wm=3, x_layout=mluops.Layout.NHWC, dtype=torch.float32,
               y_shape=None, with_data=True):
    handle = mluops.create_handle()
    x = make(n, h, w, hm * wm if fn is mluops.psamask_forward else h * w, "NHWC", dtype)
    y = torch.zeros(y_shape or ((n, h, w, h * w) if fn is mluops.psamask_forward else (n, h, w, hm * wm)), dtype=dtype)
    x_desc = mluops.create_tensor_descriptor(x_layout, mluops.descriptor_of(x).dtype, x.shape)
    y_desc = mluops.create_tensor_descriptor(mluops.Layout.NHWC, mluops.descriptor_of(y).dtype, y.shape)
    status = fn(handle, psa_type, x_desc, x if with_data else None, hm, wm, y_desc, y)
    return status, x, y, handle


@pytest.mark.parametrize("mode", [0, 1])
def test_mluops_success_writes_output(mode):
    status, x, y, _ = _nhwc_call(mluops.psamask_forward, mode)
    assert status == Status.SUCCESS
    assert bit_equal(y, cvops.psamask(x, mode, 3, "NHWC", backend="reference"))
    status, dy, dx, _ = _nhwc_call(mluops.psamask_backward, mode)
    assert status == Status.SUCCESS
    assert bit_equal(dx, cvops.psamask_backward(dy, mode, 3, "NHWC", backend="reference"))


@pytest.mark.parametrize("fn", [mluops.psamask_forward, mluops.psamask_backward])
def test_mluops_statuses(fn):
    assert _nhwc_call(fn, x_layout=mluops.Layout.NCHW)[0] == Status.BAD_PARAM
    assert _nhwc_call(fn, dtype=torch.float16)[0] == Status.BAD_PARAM  # float only
    assert _nhwc_call(fn, psa_type=2)[0] == Status.BAD_PARAM
    assert _nhwc_call(fn, with_data=False)[0] == Status.BAD_PARAM     # null pointer
    assert _nhwc_call(fn, n=0, with_data=False)[0] == Status.SUCCESS   # zero elements before pointers
    status, *_, handle = _nhwc_call(fn, y_shape=(2, 4, 4, 16 if fn is mluops.psamask_forward else 9))
    assert status == Status.BAD_PARAM and "must match" in handle.last_error
    status, *_, handle = _nhwc_call(fn, y_shape=(1, 4, 4, 15 if fn is mluops.psamask_forward else 8))
    assert status == Status.BAD_PARAM and "channels" in handle.last_error
    assert fn(None, 0, None, None, 3, 3, None, None) == Status.BAD_PARAM
    handle = mluops.create_handle()
    assert fn(handle, 0, None, None, 3, 3, None, None) == Status.BAD_PARAM and "null" in handle.last_error
