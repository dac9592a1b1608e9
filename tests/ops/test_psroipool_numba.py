"""psroipool: the numba backend (compiled loops) against the torch backend and the reference, and the default's
switch (peak memory: tests/test_memory.py)."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

import cvops
from tests.support.cases import case_id, load_cases
from cvops.metrics import bit_equal
from tests.support.inputs.psroipool import case_input, case_rois
from cvops._core.jit import numba_available
from tests.conftest import requires_numba
from tests.ops.test_psroipool import LAYOUTS, UNIT, _quick, bottom_of, params, to_layout, unit_rois

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def _pair(backend, x, rois, ph, pw, scale, group, od, layout, seed=3, convention="rfcn"):
    """forward output, mapping and backward of one backend on the same input and top_grad."""
    out, mapping = cvops.psroi_pool(x, rois, ph, pw, scale, group, od, layout, backend=backend, convention=convention)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(x.dtype)
    return out, mapping, cvops.psroi_pool_backward(g, rois, mapping, scale, od, tuple(x.shape), layout,
                                                   backend=backend, convention=convention)


@requires_numba
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("convention", ["rfcn", "torchvision"])
def test_numba_is_bit_equal_to_reference(dtype, layout, convention):
    # the same bin edges and the same summation order as the loops: identical bits, not just close
    for case in UNIT:
        x = to_layout(case_input(case, dtype), layout)
        args = (x, unit_rois(case, dtype), *params(case), layout)
        for a, b in zip(_pair("numba", *args, convention=convention), _pair("reference", *args, convention=convention)):
            assert bit_equal(a, b), case["name"]


@requires_numba
@pytest.mark.parametrize("case", [_quick(c) for c in load_cases("psroipool", "network")], ids=case_id)
def test_numba_network_cases_bit_equal_to_reference_and_deterministic(case, monkeypatch):
    monkeypatch.setenv("CVOPS_NUMBA", "1")  # the default backend: numba
    x, rois = case_input(case), case_rois(case)
    ph, pw, scale, group, od = params(case)
    out, mapping = cvops.psroi_pool(x, rois, ph, pw, scale, group, od, "NHWC")
    pick = torch.arange(0, len(rois), max(len(rois) // 12, 1))
    ref, ref_mapping = cvops.psroi_pool(x, rois[pick], ph, pw, scale, group, od, "NHWC", backend="reference")
    assert bit_equal(out[pick], ref) and torch.equal(mapping[pick], ref_mapping)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    shape = bottom_of(case)
    sub = cvops.psroi_pool_backward(g[pick], rois[pick], mapping[pick], scale, od, shape, "NHWC")
    assert bit_equal(sub, cvops.psroi_pool_backward(g[pick], rois[pick], mapping[pick], scale, od, shape, "NHWC",
                                                    backend="reference"))
    full = cvops.psroi_pool_backward(g, rois, mapping, scale, od, shape, "NHWC")
    assert bit_equal(cvops.psroi_pool_backward(g, rois, mapping, scale, od, shape, "NHWC"), full)
    assert bit_equal(cvops.psroi_pool(x, rois, ph, pw, scale, group, od, "NHWC")[0], out)


@requires_numba
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), h=st.integers(1, 9), w=st.integers(1, 9), ph=st.integers(1, 4), pw=st.integers(1, 4),
       od=st.integers(1, 12), r=st.integers(1, 6), scale=st.sampled_from([1.0, 0.5, 0.3, 2.0]),
       layout=st.sampled_from(LAYOUTS), dtype=st.sampled_from([torch.float16, torch.float32, torch.float64]),
       convention=st.sampled_from(["rfcn", "torchvision"]), seed=st.integers(0, 2**16))
def test_numba_property_bit_equal(n, h, w, ph, pw, od, r, scale, layout, dtype, convention, seed):
    g = torch.Generator().manual_seed(seed)
    x = to_layout(torch.randn((n, h, w, od * ph * pw), generator=g, dtype=torch.float64).to(dtype), layout)
    corners = (torch.rand(r, 4, generator=g, dtype=torch.float64) * 1.4 - 0.2) * torch.tensor([w, h, w, h]) / scale
    corners = torch.where(torch.rand(r, 4, generator=g) < 0.3, corners.round() + 0.5, corners)  # x.5 ties
    rois = torch.cat((torch.randint(0, n, (r, 1), generator=g).double(), corners), 1).to(dtype)
    args = (x, rois, ph, pw, scale, ph if ph == pw else 1, od, layout)
    mine = _pair("numba", *args, seed=seed, convention=convention)
    for a, b in zip(mine, _pair("reference", *args, seed=seed, convention=convention)):
        assert bit_equal(a, b)


@requires_numba
def test_numba_and_torch_paths_agree_in_float64():
    case = next(c for c in UNIT if c["name"] == "fractional_rois")
    x = to_layout(case_input(case, torch.float64), "NHWC")
    for convention in ("rfcn", "torchvision"):
        args = (x, case_rois(case, torch.float64), *params(case), "NHWC")
        fused = _pair("numba", *args, convention=convention)
        for a, b in zip(fused, _pair("torch", *args, convention=convention)):
            assert a.dtype == b.dtype and torch.allclose(a.double(), b.double(), rtol=1e-12, atol=1e-12)


def test_numba_switch_and_lazy_import(monkeypatch):
    import subprocess
    import sys
    from cvops._core.dispatch import resolve_backend

    def default():
        return resolve_backend("cvops.ops.psroipool", "psroi_pool", None, torch.device("cpu"), torch.zeros(1),
                               torch.zeros(1, 5))
    monkeypatch.setenv("CVOPS_NUMBA", "0")
    assert default() == "torch"
    monkeypatch.setenv("CVOPS_NUMBA", "1")
    assert default() == ("numba" if numba_available() else "torch")
    # importing cvops does not import numba (it loads on the first call that uses it)
    code = "import sys, cvops; assert 'numba' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


@requires_numba
@pytest.mark.parametrize("od", [40, 43])  # 49 * od channels: 1960 (transposed straight out) and 2107 (staged)
def test_numba_nhwc_backward_either_side_of_the_staging_threshold(od):
    from cvops.ops.psroipool import cpu_numba
    assert 49 * 40 <= cpu_numba._STAGED_CHANNELS < 49 * 43
    g = torch.Generator().manual_seed(od)
    x = torch.randn(2, 5, 6, 49 * od, generator=g)
    rois = torch.tensor([[0, 0, 0, 5, 4], [1, 1.5, 0.5, 4, 4], [1, -2, -1, 9, 7]])
    args = (x, rois, 7, 7, 1.0, 7, od, "NHWC")
    for a, b in zip(_pair("numba", *args), _pair("reference", *args)):
        assert bit_equal(a, b)
