"""psroipool: the shared op tester's checks (every backend against the R-FCN loop reference in every dtype and
layout, contiguity, NaN and infinities, zero elements, bad input, autograd, opcheck, compile, export, script) and
what is psroipool's own: hand-computed bins, any mapping_channel, network scale, the module (the numba path and
the MLU-OPS layer have files of their own)."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import strategies as st

import cvops
from tests.support.cases import case_id, load_cases
from cvops._core.errors import BadParamError, NotSupportedError
from cvops.metrics import bit_equal
from tests.support.inputs.psroipool import case_input, case_rois
from cvops._core.dispatch import triton_available
from tests.conftest import CPU_PATHS, FAST_BACKENDS, requires_triton
from tests.support.op_tester import LAYOUTS, OpTester, Sample

# the Triton interpreter evaluates NaN/inf sums with numpy, which warns
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

UNIT = [c for c in load_cases("psroipool", "unit") if "error" not in c]
ERRORS = [c for c in load_cases("psroipool", "unit") if "error" in c]


def bottom_of(case):
    return case.get("bottom_shape", case["input_shape"])


def unit_rois(case, dtype=torch.float32):
    """The case's RoIs, at most ~24 of them (the doc's cases draw hundreds; the loop reference is slow)."""
    rois = case_rois(case, dtype)
    return rois[::max(len(rois) // 24, 1)]

def assert_close(actual, expected):
    """MLU-OPS accumulation class (the tester's): diff1, diff2 <= 3e-3 (float64 1e-10, bfloat16 1e-2); NaN/inf at the
    same places with the same sign; exact zeros of the reference stay exact zeros."""
    TestPsroiPool().assert_matches(actual, expected, "torch")


def to_layout(x_nhwc, layout):
    return x_nhwc.permute(0, 3, 1, 2).contiguous() if layout == "NCHW" else x_nhwc.contiguous()


def params(case):
    return (case["pooled_height"], case["pooled_width"], case["spatial_scale"], case["group_size"],
            case["output_dim"])


def sample(x, rois, ph, pw, scale, group, od, layout, seed=1):
    """A forward and backward call; ``g`` is the backward's top_grad (in the dtype of ``x``)."""
    shape = (len(rois), od, ph, pw) if layout == "NCHW" else (len(rois), ph, pw, od)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(x.dtype)
    return Sample(x=x, rois=rois, g=g, ph=ph, pw=pw, scale=scale, group=group, od=od, layout=layout)


def case_sample(case, layout, dtype=torch.float32, rois=None):
    return sample(to_layout(case_input(case, dtype), layout), unit_rois(case, dtype) if rois is None else rois,
                  *params(case), layout)


@st.composite
def _pools(draw, small):
    """Any map, pooling and up to 5 RoIs (corners from outside the map to past it, x.5 ties among them)."""
    n = 2 if small else draw(st.integers(1, 2))
    h, w = draw(st.integers(1, 6 if small else 9)), draw(st.integers(1, 6 if small else 9))
    ph = draw(st.integers(1, 3 if small else 4))
    pw = ph if small else draw(st.integers(1, 4))
    od, layout = draw(st.integers(1, 3)), draw(st.sampled_from(LAYOUTS))
    r = 3 if small else draw(st.integers(1, 5))
    scale = 1.0 if small else draw(st.sampled_from([1.0, 0.5, 0.25, 0.0625, 0.3, 2.0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn((n, od * ph * pw, h, w) if layout == "NCHW" else (n, h, w, od * ph * pw), generator=g)
    img = torch.tensor([w, h, w, h]) / scale
    corners = (torch.rand(r, 4, generator=g) * 1.4 - 0.2) * img
    if not small:
        corners = torch.where(torch.rand(r, 4, generator=g) < 0.3, corners.round() + 0.5, corners)  # x.5 ties
    rois = torch.cat((torch.randint(0, n, (r, 1), generator=g).float(), corners), 1)
    return sample(x, rois, ph, pw, scale, ph if ph == pw else 1, od, layout)


def _x(c=9, dtype=torch.float32):
    return torch.zeros(1, c, 5, 5, dtype=dtype)


ROI = torch.tensor([[0.0, 0, 0, 3, 3]])


def _bad_forward(kwargs, match):
    def call(backend):
        args = dict(input=_x(), rois=ROI, pooled_height=3, pooled_width=3, spatial_scale=1.0, group_size=3,
                    output_dim=1, layout="NCHW", backend=backend)
        return cvops.psroi_pool(**{**args, **kwargs})
    return ("forward " + " ".join(kwargs), call, BadParamError, match)


def _bad_backward(kwargs, match):
    def call(backend):
        args = dict(top_grad=torch.ones(1, 1, 3, 3), rois=ROI,
                    mapping_channel=torch.zeros(1, 1, 3, 3, dtype=torch.int32), spatial_scale=1.0, output_dim=1,
                    input_shape=(1, 9, 5, 5), layout="NCHW", backend=backend)
        return cvops.psroi_pool_backward(**{**args, **kwargs})
    return ("backward " + " ".join(kwargs), call, BadParamError, match)


def _error_case(case):
    return (case["name"], lambda b: cvops.psroi_pool(case_input(case), case_rois(case), *params(case), "NHWC",
                                                     backend=b), getattr(cvops, case["error"]), "")


class TestPsroiPool(OpTester):
    op = "psroipool"
    exact = False
    exact_zeros = True      # untouched / empty-bin outputs are exact zeros in every backend
    layouts = LAYOUTS
    special_inputs = ("x", "g")
    double_backward = True
    gradcheck_fast = ("reference", "triton")
    gradgradcheck_fast = ("reference",)
    property_examples = {"torch": 30, "numba": 30, "triton": 6}
    script_saves = False    # the scripted PSRoIPool calls its checks as plain Python (torch.jit.ignore)
    bad_inputs = tuple(_bad_forward(kwargs, match) for kwargs, match in [
        (dict(group_size=2), r"group_size \(2\) must equal pooled_height == pooled_width \(3\)"),
        (dict(group_size=0), "group_size must be >= 1"),
        (dict(output_dim=2), r"input channels \(9\) must equal pooled_height \* pooled_width \* output_dim"),
        (dict(output_dim=0), "output_dim must be >= 1"),
        (dict(pooled_height=0), "pooled_height must be >= 1"),
        (dict(pooled_width=2.0), "pooled_width must be an int"),
        (dict(spatial_scale=0.0), "spatial_scale must be > 0"),
        (dict(spatial_scale=-1.0), "spatial_scale must be > 0"),
        (dict(spatial_scale=float("nan")), "spatial_scale must be > 0"),
        (dict(spatial_scale=True), "spatial_scale must be a float"),
        (dict(rois=torch.zeros(1, 4)), r"rois must be \[R, 5\]"),
        (dict(rois=torch.zeros(5)), "rois must be 2-D"),
        (dict(rois=torch.zeros(1, 5, dtype=torch.int64)), "rois dtype"),
        (dict(rois=torch.zeros(0, 5)), "rois must not be empty"),
        (dict(rois=torch.tensor([[1.0, 0, 0, 3, 3]])), r"rois\[0, 0\] = 1.0 is not a batch index in \[0, 0\]"),
        (dict(rois=torch.tensor([[-1.0, 0, 0, 3, 3]])), "is not a batch index"),
        (dict(rois=torch.tensor([[float("nan"), 0, 0, 3, 3]])), "is not a batch index"),
        (dict(input=torch.zeros(9, 5, 5)), "input must be 4-D"),
        (dict(input=_x(dtype=torch.int32)), "input dtype"),
        (dict(input=[[0.0]]), "input must be a torch.Tensor"),
        (dict(layout="NCWH"), "layout"),
        (dict(backend="gpu"), "backend"),
    ]) + tuple(_bad_backward(kwargs, match) for kwargs, match in [
        (dict(mapping_channel=torch.zeros(1, 1, 3, 2, dtype=torch.int32)), "mapping_channel shape"),
        (dict(mapping_channel=torch.zeros(1, 1, 3, 3)), "mapping_channel dtype"),
        (dict(mapping_channel=torch.full((1, 1, 3, 3), 9, dtype=torch.int32)), r"mapping_channel holds 9"),
        (dict(mapping_channel=torch.full((1, 1, 3, 3), -1, dtype=torch.int32)), r"mapping_channel holds -1"),
        (dict(mapping_channel=torch.full((1, 1, 3, 3), 2**32 + 3, dtype=torch.int64)),
         r"mapping_channel holds 4294967299"),
        (dict(input_shape=(1, 8, 5, 5)), r"input channels \(8\) must equal"),
        (dict(input_shape=(1, 9, 5)), "input_shape must be 4"),
        (dict(output_dim=2), r"top_grad channels \(1\) must equal output_dim \(2\)"),
        (dict(rois=torch.zeros(2, 5)), r"top_grad rois \(1\) must equal rois.shape\[0\] \(2\)"),
        (dict(rois=torch.tensor([[3.0, 0, 0, 3, 3]])), "is not a batch index"),
        (dict(top_grad=torch.zeros(1, 3, 3)), "top_grad must be 4-D"),
        (dict(spatial_scale=0), "spatial_scale must be > 0"),
    ]) + tuple(_error_case(case) for case in ERRORS)

    def unit_cases(self):
        return UNIT

    def case_samples(self, case, layout, dtype):
        return [case_sample(case, layout, dtype)]

    def interpretable(self, case):
        # the doc's large unit cases take minutes in the Triton interpreter; the other backends run them
        return "random_rois" not in case

    def small_samples(self, layout, dtype):
        case = next(c for c in UNIT if c["name"] == "fractional_rois")
        return [case_sample(case, layout, dtype, case_rois(case, dtype))]

    def special_samples(self, layout):
        planted = _planted()
        if layout == "NHWC":
            planted = planted.replace(x=planted.x.permute(0, 2, 3, 1).contiguous(),
                                      g=planted.g.permute(0, 2, 3, 1).contiguous(), layout="NHWC")
        return [planted]

    def grad_samples(self, layout):
        x = torch.randn((2, 12, 5, 6) if layout == "NCHW" else (2, 5, 6, 12), dtype=torch.float64,
                        generator=torch.Generator().manual_seed(0))
        rois = torch.tensor([[0, 0.5, 1, 4, 4.5], [1, -1, -1, 7, 7], [1, 4, 3, 1, 1], [0, 2, 2, 2.5, 5]],
                            dtype=torch.float64)
        return [sample(x, rois, 2, 2, 0.8, 2, 3, layout), sample(x, rois, 2, 3, 1.0, 1, 2, layout)]

    def gradgrad_samples(self, layout):
        return self.grad_samples(layout)[:1]

    def zero_samples(self, layout):
        # an empty map: every bin is empty (zeros), mapping_channel still written; the backward gives zeros
        case = next(c for c in load_cases("psroipool", "unit") if c["name"] == "empty_input")
        s = case_sample(case, layout, rois=case_rois(case))
        return [(s, (s.g.shape, s.g.shape, s.x.shape))]

    def check_zero(self, results, sample):
        out, mapping, grad = results
        assert not out.any() and not grad.any() and sorted(mapping.flatten().tolist()) == list(range(9))

    def run(self, s, backend):
        out, mapping = cvops.psroi_pool(s.x, s.rois, s.ph, s.pw, s.scale, s.group, s.od, s.layout, backend=backend)
        assert mapping.dtype == torch.int32
        grad = cvops.psroi_pool_backward(s.g, s.rois, mapping, s.scale, s.od, tuple(s.x.shape), s.layout,
                                         backend=backend)
        return out, mapping, grad

    def autograd(self, s, backend):
        return (lambda x: cvops.psroi_pool(x, s.rois, s.ph, s.pw, s.scale, s.group, s.od, s.layout,
                                           backend=backend)[0]), (s.x,)

    def module(self, s):
        if s.layout != "NCHW":
            return None
        return cvops.nn.PSRoIPool((s.ph, s.pw), s.scale, s.group, s.od), (s.x, s.rois)

    def strategy(self, backend):
        return _pools(backend == "triton")

    def tolerance(self, dtype, backend):
        # bfloat16 keeps 8 mantissa bits: two correct roundings of the same fp32 mean may differ by an ulp (2^-8)
        return {torch.float64: 1e-10, torch.bfloat16: 1e-2}.get(dtype, 3e-3)


# ------------------------------------------------------------------------------------ the semantics itself
def test_backward_doc_example_every_bin_collapses_to_pixel_0_0():
    case = next(c for c in UNIT if c["name"] == "backward_doc_example")
    rois = case_rois(case)
    top = torch.ones(2, 2, 2, 1)  # NHWC [R, PH, PW, od]
    mapping = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32).view(1, 2, 2, 1).expand(2, 2, 2, 1).contiguous()
    expected = torch.zeros(case["input_shape"])
    for n, h, w, c, v in case["expect_bottom_grad"]["nonzero"]:
        expected[n, h, w, c] = v
    for backend in ["reference", "cpu"] + (["triton"] if triton_available() else []):
        grad = cvops.psroi_pool_backward(top, rois, mapping, 0.25, 1, case["input_shape"], "NHWC", backend=backend)
        assert torch.equal(grad, expected), backend
    _, fwd_map = cvops.psroi_pool(torch.zeros(case["input_shape"]), rois, 2, 2, 0.25, 2, 1, "NHWC")
    assert torch.equal(fwd_map, mapping)


def test_hand_computed_bins_round_half_away_before_scaling():
    # 1 channel group per bin (PH = PW = 1): the output is the mean of the RoI's pixels.
    x = torch.arange(100, dtype=torch.float64).view(1, 1, 10, 10)
    def pool(box, scale=1.0):
        return float(cvops.psroi_pool(x, torch.tensor([[0.0, *box]], dtype=torch.float64), 1, 1, scale, 1, 1,
                                      backend="reference")[0])
    # y1 = 2.5 rounds to 3 (half away from zero; torch.round would give 2); x2 = 3.4 -> 3, end inclusive -> 4
    assert pool((1.5, 2.5, 3.4, 4.5)) == float(x[0, 0, 3:6, 2:4].mean())
    assert pool((-0.5, -0.5, 0.4, 0.4)) == float(x[0, 0, 0:1, 0:1].mean())  # -0.5 -> -1, clamped to 0
    # rounding before scaling: x2 = 6.5 -> 7, (7 + 1) * 0.5 = 4 -> columns 1..3 (torchvision's
    # round(6.5 * 0.5) = 3 without +1 would stop at column 2)
    assert pool((2.5, 0, 6.5, 0), 0.5) == float(x[0, 0, 0:1, 1:4].mean())
    for backend in ("cpu",):
        for box in ((1.5, 2.5, 3.4, 4.5), (-0.5, -0.5, 0.4, 0.4)):
            out = cvops.psroi_pool(x, torch.tensor([[0.0, *box]], dtype=torch.float64), 1, 1, 1.0, 1, 1,
                                   backend=backend)[0]
            assert abs(float(out) - pool(box)) < 1e-12


def test_min_roi_size_and_empty_bins():
    x = torch.ones(1, 9, 4, 4)
    # a degenerate RoI (x2 < x1) is 0.1 wide: bins of 1/30 pixel, each still covers one pixel
    out, mapping = cvops.psroi_pool(x, torch.tensor([[0.0, 3, 3, 1, 1]]), 3, 3, 1.0, 3, 1, backend="reference")
    assert torch.equal(out, torch.ones_like(out))
    # wholly outside: every bin clamps to an empty range -> 0, mapping_channel still written
    out, mapping = cvops.psroi_pool(x, torch.tensor([[0.0, 10, 10, 20, 20]]), 3, 3, 1.0, 3, 1)
    assert torch.equal(out, torch.zeros_like(out))
    assert mapping.flatten().tolist() == list(range(9))


def test_mapping_channel_formula_pooled_non_square():
    case = next(c for c in UNIT if c["name"] == "pooled_non_square")
    ph, pw, od = case["pooled_height"], case["pooled_width"], case["output_dim"]
    x = to_layout(case_input(case), "NCHW")
    _, mapping = cvops.psroi_pool(x, case_rois(case), ph, pw, 1.0, case["group_size"], od)
    for ctop, i, j in itertools.product(range(od), range(ph), range(pw)):
        assert int(mapping[0, ctop, i, j]) == (ctop * ph + i) * pw + j


@pytest.mark.parametrize("finite", [True, False])
def test_torch_path_in_column_chunks(finite, monkeypatch):
    # tables of a few output_dim columns and a few bins at a time, then one of each (cpu.TABLE_BYTES tiny):
    # the same results as one table
    from cvops.ops.psroipool import cpu
    case = next(c for c in UNIT if c["name"] == "fractional_rois")
    ph, pw, scale, group, od = params(case)
    x, rois = case_input(case).permute(0, 3, 1, 2).contiguous(), case_rois(case)
    g = torch.randn(len(rois), od, ph, pw, generator=torch.Generator().manual_seed(5))
    if not finite:
        x[0, 3, 2, 1], x[1, 0, 4, 4], g[0, 1, 1, 1], g[1, 0, 0, 2] = float("nan"), float("inf"), float("-inf"), float("nan")
    mapping = torch.randint(0, od * ph * pw, g.shape, generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    shape = tuple(x.shape)
    for table_bytes in (8 * 2 * 9 * 10 * 12 * 2, 1):  # two columns per table, then one
        monkeypatch.setattr(cpu, "TABLE_BYTES", table_bytes)
        out, canonical = cvops.psroi_pool(x, rois, ph, pw, scale, group, od, backend="torch")
        expected, _ = cvops.psroi_pool(x, rois, ph, pw, scale, group, od, backend="reference")
        assert_close(out, expected)
        for m in (canonical, mapping):
            assert_close(cvops.psroi_pool_backward(g, rois, m, scale, od, shape, backend="torch"),
                         cvops.psroi_pool_backward(g, rois, m, scale, od, shape, backend="reference"))


def test_one_pixel_map_whose_strides_read_as_both_layouts(cpu_path):
    # [1, C, 1, 1] is contiguous in NCHW and in NHWC: the gradient of channels no bin reaches (the only RoI's bins
    # are all empty) must still be zeros in every channel, not only in the first
    rois = torch.tensor([[0.0, 0.5, 1.5, 1.5, 0.9]], dtype=torch.float16)
    for layout in LAYOUTS:
        x = to_layout(torch.randn(1, 1, 1, 2, dtype=torch.float16), layout)
        out, mapping = cvops.psroi_pool(x, rois, 1, 1, 1.0, 1, 2, layout)
        grad = cvops.psroi_pool_backward(torch.ones_like(out), rois, mapping, 1.0, 2, tuple(x.shape), layout)
        assert torch.equal(out, torch.zeros_like(out)) and torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_any_mapping_channel_in_backward(backend):
    case = next(c for c in UNIT if c["name"] == "fractional_rois")
    ph, pw, scale, _, od = params(case)
    rois = case_rois(case)
    g = torch.randn(len(rois), od, ph, pw)
    mapping = torch.randint(0, od * ph * pw, g.shape, generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    shape = (2, od * ph * pw, 9, 11)
    expected = cvops.psroi_pool_backward(g, rois, mapping, scale, od, shape, backend="reference")
    if backend == "triton":
        with pytest.raises(NotSupportedError, match="mapping_channel"):
            cvops.psroi_pool_backward(g, rois, mapping, scale, od, shape, backend=backend)
        return
    assert_close(cvops.psroi_pool_backward(g, rois, mapping, scale, od, shape, backend=backend), expected)
    assert_close(cvops.psroi_pool_backward(g, rois, mapping.long(), scale, od, shape, backend=backend), expected)


# ------------------------------------------------------------------------------------ network scale
@pytest.mark.slow
@pytest.mark.parametrize("case", load_cases("psroipool", "network"), ids=case_id)
def test_network_cases_cpu_vs_reference_on_a_subsample(case, cpu_path):
    x, rois = case_input(case), case_rois(case)
    ph, pw, scale, group, od = params(case)
    out, mapping = cvops.psroi_pool(x, rois, ph, pw, scale, group, od, "NHWC")
    assert out.shape == (len(rois), ph, pw, od) and mapping.shape == out.shape
    pick = torch.arange(0, len(rois), max(len(rois) // 24, 1))
    ref, ref_map = cvops.psroi_pool(x, rois[pick], ph, pw, scale, group, od, "NHWC", backend="reference")
    assert_close(out[pick], ref)
    assert torch.equal(mapping[pick], ref_map)
    # backward on the doc's bottom_grad shape: cpu vs reference on the same subsample
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    bottom = bottom_of(case)
    expected = cvops.psroi_pool_backward(g[pick], rois[pick], mapping[pick], scale, od, bottom, "NHWC",
                                         backend="reference")
    assert_close(cvops.psroi_pool_backward(g[pick], rois[pick], mapping[pick], scale, od, bottom, "NHWC"), expected)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in load_cases("psroipool", "network") if c["name"] in
                                  ("rfcn_cls_r300", "rfcn_bbox_r2000")], ids=case_id)
def test_any_mapping_backward_at_network_scale_vs_reference(case, cpu_path):
    # a mapping_channel that is not the forward's takes the general scatter: the whole map, a RoI subsample
    # that keeps the work of the reference loops small, every channel reachable
    ph, pw, scale, group, od = params(case)
    rois = case_rois(case)
    rois = rois[::max(len(rois) // 12, 1)]
    gen = torch.Generator().manual_seed(7)
    c = case["input_shape"][3]
    mapping = torch.randint(0, c, (len(rois), ph, pw, od), generator=gen, dtype=torch.int32)
    g = torch.randn(mapping.shape, generator=gen)
    shape = case["input_shape"]
    expected = cvops.psroi_pool_backward(g, rois, mapping, scale, od, shape, "NHWC", backend="reference")
    actual = cvops.psroi_pool_backward(g, rois, mapping, scale, od, shape, "NHWC")
    assert_close(actual, expected)
    assert torch.equal(actual == 0, expected == 0)
    assert bit_equal(cvops.psroi_pool_backward(g, rois, mapping, scale, od, shape, "NHWC"), actual)


@pytest.mark.parametrize("threads", [1, 2])
def test_mapping_checked_in_every_roi_range(threads, cpu_path):
    # 2000 RoIs x 49 bins x 21 channels: enough work for the numba path to check mapping_channel on the threads,
    # each thread a range of RoIs; only the last RoI's mapping differs from the forward's, so a range not looked
    # at would send that RoI's values to the forward's channels
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 8, 9, 49 * 21, generator=gen)
    corner = torch.rand(2000, 2, generator=gen) * 90
    rois = torch.cat((torch.zeros(2000, 1), corner, corner + 1 + torch.rand(2000, 2, generator=gen) * 60), 1)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _, mapping = cvops.psroi_pool(x, rois, 7, 7, 0.0625, 7, 21, "NHWC")
        mapping[-1] = mapping[-1].flip(-1)
        g = torch.zeros(mapping.shape)
        g[-1] = torch.randn(g[-1].shape, generator=gen)
        actual = cvops.psroi_pool_backward(g, rois, mapping, 0.0625, 21, tuple(x.shape), "NHWC")
        bad = mapping.clone()
        bad[-1, 0, 0, 0] = 49 * 21
        with pytest.raises(BadParamError, match="mapping_channel"):
            cvops.psroi_pool_backward(g, rois, bad, 0.0625, 21, tuple(x.shape), "NHWC")
    finally:
        torch.set_num_threads(previous)
    expected = cvops.psroi_pool_backward(g[-1:], rois[-1:], mapping[-1:], 0.0625, 21, tuple(x.shape), "NHWC",
                                         backend="reference")
    assert_close(actual, expected)


def _quick(case):
    """Network cases small enough for every CI run; the rest (2000 RoIs, COCO) are marked slow."""
    return case if case["random_rois"]["num"] <= 300 and case["output_dim"] <= 21 else \
        pytest.param(case, marks=pytest.mark.slow)


@pytest.mark.parametrize("case", [_quick(c) for c in load_cases("psroipool", "network")], ids=case_id)
def test_network_cases_invariants(case, cpu_path):
    rois = case_rois(case)
    ph, pw, scale, group, od = params(case)
    # a constant input pools to that constant in every non-empty bin
    out, mapping = cvops.psroi_pool(torch.full(case["input_shape"], 2.5), rois, ph, pw, scale, group, od, "NHWC")
    assert set(out.unique().tolist()) <= {0.0, 2.5}
    # grad = area of each bin spread over its pixels: the gradient sums to the number of non-empty outputs
    top = torch.ones(out.shape)
    grad = cvops.psroi_pool_backward(top, rois, mapping, scale, od, case["input_shape"], "NHWC")
    assert abs(float(grad.double().sum()) - float((out != 0).sum())) < 1e-6 * float((out != 0).sum()) + 1e-3
    # determinism: the same bits on every run
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    first = cvops.psroi_pool_backward(g, rois, mapping, scale, od, bottom_of(case), "NHWC")
    for _ in range(3):
        assert bit_equal(cvops.psroi_pool_backward(g, rois, mapping, scale, od, bottom_of(case), "NHWC"), first)


# ------------------------------------------------------------------------------------ nan / inf
def _planted():
    """fractional_rois with NaN and infinities in chosen bins of its first RoIs (semantics.md 3's bin arithmetic)."""
    case = next(c for c in UNIT if c["name"] == "fractional_rois")
    s = case_sample(case, "NCHW", rois=case_rois(case))
    x, g = s.x.clone(), s.g.clone()
    x[0, 0, 2, 1] = float("nan")                                  # roi 0, bin (0,0): NaN
    x[0, 10, 3, 3], x[0, 10, 2, 2] = float("inf"), float("-inf")  # roi 0, bin (0,1): inf - inf = NaN
    x[0, 11, 2, 4] = float("-inf")                                # roi 0, bin (0,2): -inf
    x[1, 20, 4, 7] = float("inf")                                 # roi 1, bin (0,2): +inf
    g[0, 0, 0, 0], g[1, 1, 1, 1], g[2, 2, 2, 2] = float("inf"), float("nan"), float("-inf")
    return s.replace(x=x, g=g)


def test_nan_inf_reach_their_bins():
    """The reference's results of the planted sample (which the tester compares every backend with)."""
    out, _, grad = TestPsroiPool().run(_planted(), "reference")
    assert torch.isnan(out[0, 0, 0, 0]) and torch.isnan(out[0, 1, 0, 1])
    assert out[0, 1, 0, 2] == float("-inf") and out[1, 2, 0, 2] == float("inf")
    assert torch.isnan(grad).any() and torch.isinf(grad).any()


@pytest.mark.parametrize("backend", ["reference", *CPU_PATHS, pytest.param("triton", marks=requires_triton)])
def test_non_finite_roi_corners_raise_naming_rois(backend):
    x = torch.randn(1, 9, 5, 5)
    for j, v in itertools.product(range(1, 5), (float("nan"), float("inf"), float("-inf"))):
        rois = torch.tensor([[0.0, 1, 1, 3, 3], [0, 0, 0, 4, 4]])
        rois[1, j] = v
        with pytest.raises(BadParamError, match=rf"rois\[1, {j}\] = {v} is not a finite coordinate"):
            cvops.psroi_pool(x, rois, 3, 3, 1.0, 3, 1, backend=backend)
        with pytest.raises(BadParamError, match="is not a finite coordinate"):
            cvops.psroi_pool_backward(torch.ones(2, 1, 3, 3), rois, torch.zeros(2, 1, 3, 3, dtype=torch.int32), 1.0,
                                      1, (1, 9, 5, 5), backend=backend)


@pytest.mark.parametrize("backend", ["reference", *CPU_PATHS, pytest.param("triton", marks=requires_triton)])
def test_batch_index_checked_against_an_empty_batch(backend):
    rois = torch.tensor([[0.0, 0, 0, 3, 3]])
    with pytest.raises(BadParamError, match=r"rois\[0, 0\] = 0.0 is not a batch index .*N = 0"):
        cvops.psroi_pool(torch.zeros(0, 9, 5, 5), rois, 3, 3, 1.0, 3, 1, backend=backend)
    with pytest.raises(BadParamError, match=r"N = 0"):
        cvops.psroi_pool_backward(torch.ones(1, 1, 3, 3), rois, torch.zeros(1, 1, 3, 3, dtype=torch.int32), 1.0, 1,
                                  (0, 9, 5, 5), backend=backend)


# ------------------------------------------------------------------------------------ zero elements
@pytest.mark.parametrize("backend", ["reference", *CPU_PATHS, pytest.param("triton", marks=requires_triton)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_zero_rois(backend, layout):
    """An empty map with no rois at all is still SUCCESS (the input check comes first); the backward needs rois
    (the empty map with its rois is the tester's zero-element sample)."""
    case = next(c for c in load_cases("psroipool", "unit") if c["name"] == "empty_input")
    x = to_layout(case_input(case), layout)
    out, mapping = cvops.psroi_pool(x, torch.zeros(0, 5), *params(case), layout, backend=backend)
    assert out.numel() == 0
    with pytest.raises(BadParamError, match="rois must not be empty"):
        cvops.psroi_pool_backward(out, torch.zeros(0, 5), mapping, 1.0, 1, tuple(x.shape), layout, backend=backend)


# ------------------------------------------------------------------------------------ bad parameters
def test_non_square_pooled_accepts_any_group_size():
    out, _ = cvops.psroi_pool(_x(6), ROI, 2, 3, 1.0, 5, 1)
    assert out.shape == (1, 1, 2, 3)


# ------------------------------------------------------------------------------------ autograd and compile
def test_explicit_backward_is_differentiable_in_top_grad():
    rois = torch.tensor([[0, 0.5, 1, 4, 4.5], [1, 2, 2, 2.5, 5]], dtype=torch.float64)
    _, mapping = cvops.psroi_pool(torch.zeros(2, 8, 5, 6, dtype=torch.float64), rois, 2, 2, 0.8, 2, 2)
    top = torch.randn(2, 2, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: cvops.psroi_pool_backward(t, rois, mapping, 0.8, 2, (2, 8, 5, 6)), (top,))


def test_autograd_equals_explicit_backward_and_is_deterministic(cpu_path):
    x = torch.randn(2, 18, 8, 8, requires_grad=True)
    rois = torch.tensor([[0, 0, 0, 7, 7], [1, 2.5, 1.5, 6.5, 7.5], [1, 1, 1, 1, 1]])
    out, mapping = cvops.psroi_pool(x, rois, 3, 3, 1.0, 3, 2)
    g = torch.randn(out.shape)
    out.backward(g)
    assert_close(x.grad, cvops.psroi_pool_backward(g, rois, mapping, 1.0, 2, tuple(x.shape), backend="reference"))
    assert bit_equal(x.grad, cvops.psroi_pool_backward(g, rois, mapping, 1.0, 2, tuple(x.shape)))
    assert mapping.grad_fn is None and not mapping.requires_grad


def test_module_boxes_list_and_inferred_output_dim():
    x = torch.randn(2, 18, 6, 6)
    m = cvops.nn.PSRoIPool((3, 3), 1.0)  # torchvision-style: output_dim from the channels
    boxes = [torch.tensor([[1.0, 1, 4, 4]]), torch.tensor([[0.0, 0, 5, 5], [2, 2, 3, 3]])]
    rois = torch.tensor([[0.0, 1, 1, 4, 4], [1, 0, 0, 5, 5], [1, 2, 2, 3, 3]])
    assert torch.equal(m(x, boxes), cvops.psroi_pool(x, rois, 3, 3, 1.0, 3, 2)[0])
    assert "pooled_size=(3, 3)" in repr(m)
    tv = cvops.nn.PSRoIPool(output_size=3, spatial_scale=1.0, keep_mapping=True)  # torchvision's keywords
    assert torch.equal(tv(x, rois), m(x, boxes)) and tv.last_mapping_channel.shape == (3, 2, 3, 3)
    import numpy as np
    assert torch.equal(cvops.psroi_pool(x, rois, 3, 3, np.float32(1.0), 3, 2)[0], m(x, rois))
    with pytest.raises(BadParamError, match="group_size"):
        cvops.nn.PSRoIPool(3, 1.0, group_size=2)
    with pytest.raises(BadParamError, match=r"boxes\[0\] must be \[L, 4\]"):
        m(x, [torch.zeros(1, 5)])
