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
from tests.conftest import (CPU_PATHS, FAST_BACKENDS, installed_cpu_paths, requires_numba,
                           requires_triton, selected)

MODES = ("collect", "distribute")
LAYOUTS = ("NCHW", "NHWC")


def make(n, h, w, c, layout, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def run_case(backend, n, h, w, hm, wm, mode, layout, dtype=torch.float32):
    x = make(n, h, w, hm * wm, layout, dtype)
    dy = make(n, h, w, h * w, layout, dtype, seed=1)
    for fn, t in ((cvops.psamask_forward, x), (cvops.psamask_backward, dy)):
        expected = fn(t, mode, (hm, wm), layout, backend="reference")
        with selected(backend) as name:
            actual = fn(t, mode, (hm, wm), layout, backend=name)
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
        with selected(backend) as name:
            actual = cvops.psamask(x, mode, 3, backend=name)
        assert bit_equal(actual, expected)
        assert torch.isnan(actual).any() and torch.isinf(actual).any()


@pytest.mark.parametrize("path", CPU_PATHS)
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), h=st.integers(1, 7), w=st.integers(1, 7), hm=st.integers(1, 15),
       wm=st.integers(1, 15), mode=st.sampled_from(MODES), layout=st.sampled_from(LAYOUTS))
def test_property_cpu_matches_reference(path, n, h, w, hm, wm, mode, layout):
    run_case(path, n, h, w, hm, wm, mode, layout)


@requires_triton
@settings(max_examples=8, deadline=None)
@given(h=st.integers(1, 5), w=st.integers(1, 5), hm=st.integers(1, 9), wm=st.integers(1, 9),
       mode=st.sampled_from(MODES), layout=st.sampled_from(LAYOUTS))
def test_property_triton_matches_reference(h, w, hm, wm, mode, layout):
    run_case("triton", 1, h, w, hm, wm, mode, layout)


@pytest.mark.parametrize("path", CPU_PATHS)
def test_non_contiguous_input(path):
    x = make(2, 6, 5, 9 * 2, "NCHW")[:, ::2]  # channel stride 2 * H * W
    dy = make(3, 6, 5, 30, "NHWC", seed=2)[1:, :, :, :]  # storage offset
    assert not x.is_contiguous()
    for mode in MODES:
        with selected(path):
            out = cvops.psamask(x, mode, 3)
            dx = cvops.psamask_backward(dy, mode, 3, "NHWC")
        assert bit_equal(out, cvops.psamask(x.contiguous(), mode, 3, backend="reference"))
        assert bit_equal(dx, cvops.psamask_backward(dy.contiguous(), mode, 3, "NHWC", backend="reference"))


# -------------------------------------------------------------------------------- network scale
@pytest.mark.slow
# the Cityscapes test map (8192 positions) is left to the benchmark: its loop reference takes minutes
@pytest.mark.parametrize("case", [c for c in load_cases("psamask", "network")
                                  if c["N"] <= 2 and c["H"] * c["W"] <= 49 * 49], ids=case_id)
def test_network_scale_cpu_matches_reference(case):
    # the loop reference is the slow part: run it once, compare every cpu path with it
    paths = installed_cpu_paths()
    h, w, mask, mode, layout = case["H"], case["W"], (case["h_mask"], case["w_mask"]), case["psa_type"], case["layout"]
    x = make(1, h, w, mask[0] * mask[1], layout)
    dy = make(1, h, w, h * w, layout, seed=1)
    for fn, t in ((cvops.psamask_forward, x), (cvops.psamask_backward, dy)):
        expected = fn(t, mode, mask, layout, backend="reference")
        for path in paths:
            with selected(path) as name:
                assert bit_equal(fn(t, mode, mask, layout, backend=name), expected), (fn.__name__, path)


# -------------------------------------------------------------------------------- numba path
@requires_numba
@pytest.mark.parametrize("tile", [1, 3, 100])
def test_numba_any_tile_and_split_bit_exact(tile, monkeypatch):
    """Every tile width and thread split of the compiled loops gives the reference's bits."""
    from cvops.ops.psamask import cpu_numba
    monkeypatch.setattr(cpu_numba, "CONTIGUOUS_TILE", tile)
    monkeypatch.setattr(cpu_numba, "_PARALLEL_ELEMENTS", 1)  # split even tiny calls over the threads
    for n, h, w, hm, wm in ((2, 5, 7, 3, 5), (1, 6, 4, 13, 9), (3, 3, 5, 4, 2)):
        for mode, layout in itertools.product(MODES, LAYOUTS):
            run_case("cpu-numba", n, h, w, hm, wm, mode, layout)


@requires_numba
@pytest.mark.parametrize("layout", LAYOUTS)
def test_numba_result_independent_of_thread_count(layout):
    case = next(c for c in load_cases("psamask", "network") if c["N"] == 1)
    x = make(1, case["H"], case["W"], case["h_mask"] * case["w_mask"], layout)
    dy = make(1, case["H"], case["W"], case["H"] * case["W"], layout, seed=1)
    threads = torch.get_num_threads()
    try:
        for mode in MODES:
            for fn, t in ((cvops.psamask_forward, x), (cvops.psamask_backward, dy)):
                with selected("cpu-torch"):
                    expected = fn(t, mode, 97, layout)
                for count in (1, 2, 3):
                    torch.set_num_threads(count)
                    with selected("cpu-numba"):
                        assert bit_equal(fn(t, mode, 97, layout), expected), (fn.__name__, mode, count)
                torch.set_num_threads(threads)
    finally:
        torch.set_num_threads(threads)
