"""psamask: the shared op tester's checks (every backend bit-exact against the doc's loops in every dtype and
layout, contiguity, NaN payloads, zero elements, bad input, autograd, opcheck, compile, export, script) and what
is psamask's own: hand-computed examples, the adjoint, network scale, the numba tiles, the module and the
MLU-OPS layer."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import strategies as st

import cvops
from cvops import mluops
from tests.support.cases import case_id, load_cases
from cvops._core.errors import BadParamError, Status
from cvops.metrics import bit_equal
from tests.conftest import installed_cpu_paths, requires_numba
from tests.support.op_tester import ALL, LAYOUTS, OpTester, Sample, backend_params

MODES = ("collect", "distribute")


def make(n, h, w, c, layout, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def sample(n, h, w, hm, wm, mode, layout, dtype=torch.float32):
    """Forward input and backward grad_output of an ``n x h x w`` map under an ``hm x wm`` mask."""
    return Sample(x=make(n, h, w, hm * wm, layout, dtype), dy=make(n, h, w, h * w, layout, dtype, seed=1),
                  mode=mode, mask=(hm, wm), layout=layout)


def run_case(backend, n, h, w, hm, wm, mode, layout, dtype=torch.float32):
    """Forward and backward of one sample on ``backend``: the reference's bits."""
    TestPsamask().check(sample(n, h, w, hm, wm, mode, layout, dtype), backend,
                        what=str((n, h, w, hm, wm, mode, layout)))


def _x9():
    return torch.randn(1, 9, 4, 4)


class TestPsamask(OpTester):
    op = "psamask"
    exact = True
    layouts = LAYOUTS
    special_inputs = ("x", "dy")
    double_backward = True
    property_examples = {"torch": 40, "numba": 40, "triton": 8}
    bad_inputs = (
        # 5 channels for a 3x3 mask: accepting it would index taps 5..8 past the channel axis
        ("channels", lambda b: cvops.psamask(torch.randn(1, 5, 4, 4), "collect", 3, backend=b), BadParamError,
         r"input channels \(5\) must equal h_mask \* w_mask"),
        ("channels NHWC", lambda b: cvops.psamask(torch.randn(1, 4, 4, 10), "distribute", (3, 3), "NHWC", backend=b),
         BadParamError, r"input channels \(10\)"),
        ("grad channels", lambda b: cvops.psamask_backward(torch.randn(1, 15, 4, 4), "collect", 3, backend=b),
         BadParamError, r"grad_output channels \(15\) must equal h_feature \* w_feature"),
        ("psa_type str", lambda b: cvops.psamask(_x9(), "gather", 3, backend=b), BadParamError, "psa_type"),
        ("psa_type bool", lambda b: cvops.psamask(_x9(), True, 3, backend=b), BadParamError, "psa_type"),
        ("mask_size 0", lambda b: cvops.psamask(_x9(), "collect", 0, backend=b), BadParamError,
         "mask_size must be >= 1"),
        ("mask_size triple", lambda b: cvops.psamask(_x9(), "collect", (3, 3, 1), backend=b), BadParamError,
         "mask_size"),
        ("mask_size float", lambda b: cvops.psamask(_x9(), "collect", 3.0, backend=b), BadParamError,
         "mask_size must be an int"),
        ("mask_size None", lambda b: cvops.psamask(_x9(), "collect", None, backend=b), BadParamError, "mask_size"),
        ("rank", lambda b: cvops.psamask(torch.randn(9, 4, 4), "collect", 3, backend=b), BadParamError,
         "input must be 4-D"),
        ("dtype", lambda b: cvops.psamask(torch.ones(1, 9, 4, 4, dtype=torch.int32), "collect", 3, backend=b),
         BadParamError, "input dtype"),
        ("not a tensor", lambda b: cvops.psamask([[1.0]], "collect", 3, backend=b), BadParamError,
         "input must be a torch.Tensor"),
        ("layout", lambda b: cvops.psamask(_x9(), "collect", 3, "CHWN", backend=b), BadParamError, "layout"),
        ("backend", lambda b: cvops.psamask(_x9(), "collect", 3, backend="mlu"), BadParamError, "backend"),
    )

    def case_samples(self, case, layout, dtype):
        # every mode on each case's shape, whatever mode the case names
        return [sample(case["N"], case["H"], case["W"], case["h_mask"], case["w_mask"], mode, layout, dtype)
                for mode in MODES]

    def interpretable(self, case):
        return case["N"] * case["H"] * case["W"] <= 2000

    def small_samples(self, layout, dtype):
        return [sample(n, h, w, hm, wm, mode, layout, dtype)
                for n, h, w, hm, wm in ((2, 4, 5, 3, 4), (1, 4, 4, 3, 3)) for mode in MODES]

    def grad_samples(self, layout):
        # a 3x5 feature under a 3x2 mask: collect and distribute differ, so a backward that used the other
        # direction's adjoint fails the Jacobian comparison
        return [sample(1, 3, 5, 3, 2, mode, layout, torch.float64) for mode in MODES]

    def zero_samples(self, layout):
        nhwc = layout == "NHWC"
        s = Sample(x=torch.randn((0, 4, 4, 9) if nhwc else (0, 9, 4, 4)), dy=torch.randn(2, 0, 0, 0),
                   mode="collect", mask=(3, 3), layout=layout)
        return [(s, ((0, 4, 4, 16) if nhwc else (0, 16, 4, 4), (2, 0, 0, 9) if nhwc else (2, 9, 0, 0)))]

    def run(self, s, backend):
        return (cvops.psamask_forward(s.x, s.mode, s.mask, s.layout, backend=backend),
                cvops.psamask_backward(s.dy, s.mode, s.mask, s.layout, backend=backend))

    def autograd(self, s, backend):
        # gradgradcheck differentiates the backward op in grad_output as well: psamask_backward's own gradient
        return (lambda x: cvops.psamask(x, s.mode, s.mask, s.layout, backend=backend)), (s.x,)

    def module(self, s):
        return (cvops.nn.PSAMask(s.mode, s.mask), (s.x,)) if s.layout == "NCHW" else None

    def strategy(self, backend):
        small = backend == "triton"
        return st.builds(sample, n=st.integers(1, 1 if small else 2), h=st.integers(1, 5 if small else 7),
                         w=st.integers(1, 5 if small else 7), hm=st.integers(1, 9 if small else 15),
                         wm=st.integers(1, 9 if small else 15), mode=st.sampled_from(MODES),
                         layout=st.sampled_from(LAYOUTS))


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
            assert bit_equal(fn(t, mode, mask, layout, backend=path), expected), (fn.__name__, path)


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
            run_case("numba", n, h, w, hm, wm, mode, layout)


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
                expected = fn(t, mode, 97, layout, backend="torch")
                for count in (1, 2, 3):
                    torch.set_num_threads(count)
                    assert bit_equal(fn(t, mode, 97, layout, backend="numba"), expected), (fn.__name__, mode, count)
                torch.set_num_threads(threads)
    finally:
        torch.set_num_threads(threads)


def test_backward_is_the_adjoint_of_its_own_mode():
    # <psamask(x), dy> == <x, psamask_backward(dy)> for the same mode, and not for the other one
    x = make(2, 4, 3, 9, "NCHW", torch.float64)
    dy = make(2, 4, 3, 12, "NCHW", torch.float64, seed=3)
    for mode, other in (("collect", "distribute"), ("distribute", "collect")):
        lhs = (cvops.psamask(x, mode, 3) * dy).sum()
        assert torch.allclose(lhs, (x * cvops.psamask_backward(dy, mode, 3)).sum())
        assert not torch.allclose(lhs, (x * cvops.psamask_backward(dy, other, 3)).sum())
        xg = x.clone().requires_grad_()
        cvops.psamask(xg, mode, 3).backward(dy)
        assert torch.equal(xg.grad, cvops.psamask_backward(dy, mode, 3, backend="reference"))


# -------------------------------------------------------------------------------- nn and MLU-OPS layer
def test_module_matches_functional_and_rejects_bad_modes():
    x = make(2, 4, 5, 12, "NCHW")
    for mode in MODES:
        m = cvops.nn.PSAMask(mode, (4, 3))
        assert torch.equal(m(x), cvops.psamask(x, mode, (4, 3), backend="reference"))
        assert mode in repr(m)
    with pytest.raises(BadParamError, match="psa_type"):
        cvops.nn.PSAMask("both", 3)
    with pytest.raises(BadParamError, match="mask_size"):
        cvops.nn.PSAMask("collect", 0)
    with pytest.raises(BadParamError, match=r"input channels \(12\)"):
        cvops.nn.PSAMask("collect", 3)(x)


# -------------------------------------------------------------------------------- out=
@pytest.mark.parametrize("backend", backend_params(ALL))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_receives_the_result_and_is_returned(backend, layout):
    """Every element of ``out`` is written (it starts as NaN), with the bits of a call without it."""
    for mode in MODES:
        s = sample(2, 4, 5, 3, 4, mode, layout)
        for fn, t in ((cvops.psamask_forward, s.x), (cvops.psamask_backward, s.dy)):
            want = fn(t, mode, s.mask, layout, backend=backend)
            out = torch.full_like(want, float("nan"))
            assert fn(t, mode, s.mask, layout, backend=backend, out=out) is out
            assert bit_equal(out, want), (fn.__name__, mode)


def test_out_with_zero_elements_and_without_grad_mode():
    x = torch.randn(0, 9, 4, 4)
    out = torch.full((0, 16, 4, 4), 1.0)
    assert cvops.psamask_forward(x, "collect", 3, out=out) is out
    leaf = torch.randn(1, 9, 3, 3, requires_grad=True)
    with torch.no_grad():  # as torch's out= functions: allowed where no gradient is recorded
        out = cvops.psamask_forward(leaf, "collect", 3, out=torch.empty(1, 9, 3, 3))
    assert torch.equal(out, cvops.psamask_forward(leaf.detach(), "collect", 3))


@pytest.mark.parametrize("bad, rule", [
    (lambda x: torch.empty(1, 16, 4, 4, dtype=torch.float64), "out must be torch.float32 on cpu"),
    (lambda x: torch.empty(1, 16, 4, 5), r"out must have shape \(1, 16, 4, 4\)"),
    (lambda x: torch.empty(1, 4, 4, 16).permute(0, 3, 1, 2), "out must be contiguous"),
    (lambda x: x, "out must not share memory with the input"),
    (lambda x: torch.empty(1, 16, 4, 4, device="meta"), "out must be torch.float32 on cpu"),
    (lambda x: [0.0], "out must be a torch.Tensor"),
])
def test_bad_out_is_refused_naming_the_rule(bad, rule):
    x = torch.randn(1, 16, 4, 4)  # a 4x4 map under a 4x4 mask: out has the input's shape
    with pytest.raises(BadParamError, match=rule):
        cvops.psamask_forward(x, "collect", 4, out=bad(x))
    with pytest.raises(BadParamError, match="out= does not differentiate"):
        cvops.psamask_backward(x.clone().requires_grad_(), "collect", 4, out=torch.empty(1, 16, 4, 4))
    both = torch.randn(2, 16, 4, 4)
    half_over = torch.as_strided(both, (1, 16, 4, 4), (256, 16, 4, 1), 128)  # over the input's second half
    with pytest.raises(BadParamError, match="share memory"):
        cvops.psamask_forward(both[:1], "distribute", 4, out=half_over)


def _mlu_psamask(direction, psa_type, x, out, h_mask, w_mask, layout=mluops.Layout.NHWC):
    handle = mluops.create_handle()
    x_desc = mluops.descriptor_of(x, layout)
    out_desc = mluops.descriptor_of(out, layout)
    fn = mluops.psamask_forward if direction == "forward" else mluops.psamask_backward
    return fn(handle, psa_type, x_desc, x, h_mask, w_mask, out_desc, out), handle


@pytest.mark.parametrize("mode", [0, 1])
def test_mluops_forward_and_backward_match_functional(mode):
    x = make(2, 4, 5, 6, "NHWC")
    y = torch.full((2, 4, 5, 20), 7.0)
    status, handle = _mlu_psamask("forward", mode, x, y, 3, 2)
    assert status == Status.SUCCESS and handle.last_error == ""
    assert torch.equal(y, cvops.psamask(x, mode, (3, 2), "NHWC", backend="reference"))
    dy = make(2, 4, 5, 20, "NHWC", seed=4)
    dx = torch.full((2, 4, 5, 6), 7.0)
    status, _ = _mlu_psamask("backward", mode, dy, dx, 3, 2)
    assert status == Status.SUCCESS
    assert torch.equal(dx, cvops.psamask_backward(dy, mode, (3, 2), "NHWC", backend="reference"))


def test_mluops_bad_parameters_return_bad_param():
    x, y = torch.zeros(1, 4, 4, 9), torch.zeros(1, 4, 4, 16)
    cases = [
        ("forward", 2, x, y, 3, 3),                                    # unknown psa_type
        ("forward", 0, torch.zeros(1, 4, 4, 5), y, 3, 3),              # channels != h_mask * w_mask
        ("forward", 0, x, torch.zeros(1, 4, 4, 15), 3, 3),             # output channels != H * W
        ("forward", 0, x, torch.zeros(1, 4, 5, 20), 3, 3),             # N, H, W differ
        ("forward", 0, x.double(), y.double(), 3, 3),                  # only FLOAT
        ("forward", 0, x, y, None, 3),                                 # h_mask is null
        ("forward", 0, x, y, "3", 3),                                  # h_mask a string
        ("backward", 0, torch.zeros(1, 4, 4, 15), torch.zeros(1, 4, 4, 9), 3, 3),
        ("forward", 0, y, y, 4, 4),                                    # y is x: written while read
    ]
    for direction, mode, a, b, hm, wm in cases:
        status, handle = _mlu_psamask(direction, mode, a, b, hm, wm)
        assert status == Status.BAD_PARAM, (direction, mode, a.shape, b.shape, hm, wm)
        assert handle.last_error
    status, _ = _mlu_psamask("forward", 0, x, y, 3, 3, layout=mluops.Layout.NCHW)
    assert status == Status.BAD_PARAM
    assert mluops.psamask_forward(None, 0, mluops.descriptor_of(x, 1), x, 3, 3,
                                  mluops.descriptor_of(y, 1), y) == Status.BAD_PARAM


# -------------------------------------------------------------------------------- numba sheared tiles (NCHW)
# Contiguous NCHW maps at least 8 wide whose mask does not cover the whole width take cpu_numba's
# sheared-tile kernels; these shapes cover full and partial 8 x 8 blocks on both sides, odd and even masks
# and masks both narrower and wider than the map (narrow ones leave near-side blocks outside the band the
# far side reads, which the kernels skip).
SHEARED_SHAPES = ((2, 5, 13, 3, 5), (1, 9, 16, 7, 9), (1, 4, 24, 4, 6), (2, 3, 17, 5, 30), (1, 6, 8, 2, 1),
                  (2, 3, 40, 3, 5))
# masks that cover the whole map from every position (PSANet's training shapes) take the row kernels both
# ways; odd and even masks, exactly covering and wider
COVERING_SHAPES = ((1, 9, 9, 17, 17), (2, 5, 10, 9, 19), (1, 8, 11, 16, 22))


@requires_numba
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numba_sheared_tiles_bit_exact(dtype, monkeypatch):
    from cvops.ops.psamask import cpu_numba
    monkeypatch.setattr(cpu_numba, "_PARALLEL_ELEMENTS", 1)  # split even tiny calls over the threads
    threads = torch.get_num_threads()
    try:
        for n, h, w, hm, wm in SHEARED_SHAPES:
            assert cpu_numba._sheared(make(n, h, w, hm * wm, "NCHW", dtype), "NCHW", w, wm)
            for count in (1, 3):
                torch.set_num_threads(count)
                for mode in MODES:
                    run_case("numba", n, h, w, hm, wm, mode, "NCHW", dtype)
    finally:
        torch.set_num_threads(threads)


@requires_numba
def test_numba_covering_masks_take_row_kernels_and_stay_exact():
    from cvops.ops.psamask import cpu_numba
    for n, h, w, hm, wm in COVERING_SHAPES:
        x = make(n, h, w, hm * wm, "NCHW")
        assert not cpu_numba._sheared(x, "NCHW", w, wm)
        for mode in MODES:
            run_case("numba", n, h, w, hm, wm, mode, "NCHW")


@requires_numba
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_numba_backward_tiles_narrower_than_the_map(layout):
    """Maps wider than the NCHW backward's tile (BACKWARD_TILE planes): partial tiles (NHWC: whole blocks)."""
    from cvops.ops.psamask import cpu_numba
    w = cpu_numba.BACKWARD_TILE + 5
    for mode in MODES:
        run_case("numba", 2, 3, w, 5, 2 * w + 1, mode, layout)


@requires_numba
def test_numba_sheared_tiles_copy_nan_payloads():
    x = make(1, 5, 12, 15, "NCHW", torch.float64)
    x.view(torch.int64)[0, 7, 2, 3] = 0x7FF0000000000123  # a signalling NaN with a payload
    x[0, 8, 1, 9] = float("-inf")
    x32 = make(1, 5, 12, 15, "NCHW")
    x32.view(torch.int32)[0, 7, 2, 3] = 0x7F800123
    for t in (x, x32):
        for mode in MODES:
            expected = cvops.psamask(t, mode, (3, 5), backend="reference")
            actual = cvops.psamask(t, mode, (3, 5), backend="numba")
            assert bit_equal(actual, expected)
            assert torch.isnan(actual).any()


@pytest.mark.slow
@requires_numba
@pytest.mark.parametrize("mode", MODES)
def test_numba_cityscapes_map_matches_strided_copies(mode):
    """PSANet's whole-image test map through the sheared tiles, against the (reference-tested) torch path."""
    case = next(c for c in load_cases("psamask", "network") if c["name"] == f"psanet_cityscapes_test_{mode}")
    h, w, mask = case["H"], case["W"], (case["h_mask"], case["w_mask"])
    x = make(1, h, w, mask[0] * mask[1], "NCHW")
    dy = make(1, h, w, h * w, "NCHW", seed=1)
    for fn, t in ((cvops.psamask_forward, x), (cvops.psamask_backward, dy)):
        expected = fn(t, mode, mask, "NCHW", backend="torch")
        assert bit_equal(fn(t, mode, mask, "NCHW", backend="numba"), expected), fn.__name__


# -------------------------------------------------------------------------------- numba staged row kernels
# The row kernels build each tile of output planes in a per-thread buffer and stream it out whole cache lines
# at a time; a line holds 64 // itemsize elements, so each element width has its own line splits. NHWC
# maps and 2-byte NCHW maps take the row kernels in both directions, the covering NCHW shapes backward.
STAGED_SHAPES = ((2, 5, 7, 9, 13), (1, 6, 19, 5, 7), (3, 3, 4, 4, 2))


@requires_numba
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_numba_staged_row_kernels_every_width_bit_exact(dtype, monkeypatch):
    from cvops.ops.psamask import cpu_numba
    monkeypatch.setattr(cpu_numba, "_PARALLEL_ELEMENTS", 1)  # split even tiny calls over the threads
    monkeypatch.setattr(cpu_numba, "BACKWARD_TILE", 3)  # partial tiles at these widths
    threads = torch.get_num_threads()
    try:
        for count in (1, 3):
            torch.set_num_threads(count)
            for (n, h, w, hm, wm), mode, layout in itertools.product(STAGED_SHAPES, MODES, LAYOUTS):
                run_case("numba", n, h, w, hm, wm, mode, layout, dtype)
    finally:
        torch.set_num_threads(threads)


@requires_numba
@pytest.mark.parametrize("kernel", ["_forward_q_major", "_forward_p_major", "_backward_d_major",
                                    "_backward_p_major"])
def test_numba_staged_row_kernels_any_output_alignment(kernel):
    """Output starting anywhere within a cache line: whole lines streamed, partial ones at both ends stored."""
    import numpy as np
    from cvops.ops.psamask import cpu_numba
    n, h, w, hm, wm = 2, 5, 6, 7, 9
    forward = kernel.startswith("_forward")
    t = make(n, h, w, hm * wm if forward else h * w, "NCHW", seed=3)
    fn = cvops.psamask_forward if forward else cvops.psamask_backward
    # storage [n, q, p] (q_major), [n, p, q] (p_major) of the forward; [n, d, p] / [n, p, d] of dx
    layout = "NCHW" if kernel in ("_forward_q_major", "_backward_d_major") else "NHWC"
    expected = fn(t, "collect", (hm, wm), "NCHW", backend="reference")
    if layout == "NHWC":
        expected = expected.permute(0, 2, 3, 1)
    if kernel == "_backward_p_major":
        t = t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # NHWC storage
    sn, sc, sh, sw = t.stride()
    strides = (sn, wm * sc, sc, sh, sw) if forward else (sn, w * sc, sc, sh, sw)
    blocks = n * (hm if kernel == "_backward_d_major" else h)
    for skip in range(16):  # float32: 16 elements a line
        raw = np.full(expected.numel() + 32, np.nan, dtype=np.float32)
        out = torch.from_numpy(raw[skip:skip + expected.numel()]).view(expected.shape)
        cpu_numba._launch(getattr(cpu_numba, kernel), 4, out, t, strides, h, w, hm, wm, blocks)
        assert bit_equal(out, expected), skip
        assert np.isnan(raw[:skip]).all() and np.isnan(raw[skip + expected.numel():]).all()


@requires_numba
def test_numba_sheared_tiles_split_over_threads(monkeypatch):
    """Sheared-tile blocks of odd and line-multiple widths, each call split over the threads."""
    from cvops.ops.psamask import cpu_numba
    monkeypatch.setattr(cpu_numba, "_PARALLEL_ELEMENTS", 1)
    for dtype in (torch.float32, torch.float64):
        for n, h, w, hm, wm in SHEARED_SHAPES:
            for mode in MODES:
                run_case("numba", n, h, w, hm, wm, mode, "NCHW", dtype)
