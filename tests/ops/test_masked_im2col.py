"""masked_im2col / masked_col2im / MaskedConv2d. The shared op tester runs im2col and col2im (forward and
backward) on every backend against the loop reference (copies bit-exact, the im2col backward's sums within
diff1/diff2) in every dtype, with NaN, infinities and -0.0, non-contiguous inputs, zero points, bad input,
autograd, opcheck, compile and export; here what is their own and MaskedConv2d."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

import cvops
from cvops import mluops
from tests.support.cases import case_id, load_cases
from cvops._core.errors import BadParamError, Status
from cvops._core.jit import numba_enabled
from cvops.metrics import bit_equal, diff1, diff2
from cvops.ops.masked_im2col import cpu, reference
from tests.support.inputs.masked_im2col import case_inputs, case_mask
from tests.conftest import CPU_PATHS, requires_numba, requires_triton
from tests.support.op_tester import OpTester, Sample

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INDEX = [torch.int32, torch.int64]
UNIT = load_cases("masked_im2col", "unit")


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


def im2col_sample(feature, h, w, kernel, pad, seed=1):
    """An im2col call (``kernel`` a pair) and the gradient of its columns (the backward sums duplicate points' taps)."""
    cols = (feature.shape[1] * kernel[0] * kernel[1], h.shape[0])
    g = torch.randn(cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(feature.dtype)
    return Sample(feature=feature, h=h, w=w, kernel=tuple(kernel), pad=pad, g=g)


def col2im_sample(cols, h, w, height, width, seed=1):
    """A col2im call and the gradient of its map (the backward gathers it at the points)."""
    g = torch.randn((1, cols.shape[0], height, width), generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64).to(cols.dtype)
    return Sample(cols=cols, h=h, w=w, height=height, width=width, g=g)


@st.composite
def _calls(draw, col2im):
    """Up to 12 points, in the map or up to 6 outside it, on a map of up to 4 x 7 x 7; any window and padding."""
    c, hh, ww, m = draw(st.integers(1, 4)), draw(st.integers(1, 7)), draw(st.integers(1, 7)), draw(st.integers(0, 12))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    h = torch.randint(-6, hh + 6, (m,), generator=gen)
    w = torch.randint(-6, ww + 6, (m,), generator=gen).int()
    if col2im:
        return col2im_sample(torch.randn(c, m, generator=gen), h, w, hh, ww)
    kernel = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    pad = (draw(st.integers(-2, 3)), draw(st.integers(-2, 3)))
    return im2col_sample(torch.randn(1, c, hh, ww, generator=gen), h, w, kernel, pad)


SPECIAL_KERNELS = [((3, 3), (1, 1)), ((1, 1), (0, 0)), ((2, 4), (0, 2)), ((9, 11), (1, 1))]
GRAD_POINTS = (torch.tensor([0, 2, 2, -1, 4, 6, 1, 3]),  # duplicates, partial and empty windows
               torch.tensor([0, 1, 1, 0, 3, 1, -2, 3], dtype=torch.int32))
GOOD_IDX = torch.tensor([0, 1])


def _bad(fn, args, match):
    return (match, lambda b: fn(*args, backend=b), BadParamError, match)


class TestMaskedIm2col(OpTester):
    op = "masked_im2col"
    exact = (True, False)    # the columns are copies; the backward sums the taps of duplicate points
    special_inputs = ("feature",)
    double_backward = True
    property_examples = {"torch": 25, "numba": 25, "triton": 5}
    bad_inputs = tuple(_bad(cvops.masked_im2col, args, match) for args, match in [
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
        *(((torch.empty(shape), torch.tensor([0]), torch.tensor([0]), 3, 1), "feature must not be empty")
          for shape in ((1, 0, 4, 4), (1, 3, 0, 4), (1, 3, 4, 0))),
    ]) + (("backend", lambda b: cvops.masked_im2col(torch.randn(1, 2, 3, 3), GOOD_IDX, GOOD_IDX, 3, 1, backend="cuda"),
           BadParamError, "backend must be one of"),)

    def case_samples(self, case, layout, dtype):
        return [im2col_sample(*case_inputs(case))]   # in the case's own dtypes

    def interpretable(self, case):
        return case["feature"][1] <= 8

    def small_samples(self, layout, dtype):
        # NaN, infinities and -0.0 in the feature; negative and out-of-range points; windows from 1x1 to past the map
        feature = special_feature((1, 5, 7, 9), dtype)
        samples = [im2col_sample(feature, *random_points(30, -4, 12, index_dtype), kernel, pad)
                   for index_dtype in INDEX for kernel, pad in SPECIAL_KERNELS]
        # many duplicate points: the backward's sums
        feature = torch.randn(1, 4, 6, 5, generator=torch.Generator().manual_seed(2)).to(dtype)
        return samples + [im2col_sample(feature, *random_points(40, -3, 9, torch.int64, seed=3), (3, 4), (1, 2))]

    def deterministic_samples(self, layout, backend):
        samples = self.small_samples(layout, torch.float32)
        return samples[-1:] + samples[:-1]   # the backward's sums of duplicate points first (the interpreter's)

    def special_samples(self, layout):
        # the small samples hold NaN and infinities already (test_dtype); the widest window once more
        return [s for s in self.small_samples(layout, torch.float32) if s.kernel == (9, 11)]

    def grad_samples(self, layout):
        feature = torch.randn(1, 3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        return [im2col_sample(feature, *GRAD_POINTS, (3, 2), (1, 0))]

    def zero_samples(self, layout):
        empty = torch.empty(0, dtype=torch.int32)
        return [(im2col_sample(torch.randn(1, 3, 4, 4), empty, empty, (2, 3), (1, 1)), ((18, 0), (1, 3, 4, 4)))]

    def run(self, s, backend):
        feature = s.feature.detach().requires_grad_()
        out = cvops.masked_im2col(feature, s.h, s.w, s.kernel, s.pad, backend=backend)
        return out.detach(), *torch.autograd.grad(out, feature, s.g)

    def autograd(self, s, backend):
        return (lambda f: cvops.masked_im2col(f, s.h, s.w, s.kernel, s.pad, backend=backend)), (s.feature,)

    def strategy(self, backend):
        return _calls(col2im=False)


DUPLICATES = (torch.tensor([0, 2, 2, -1, 5, 4, 0, 3], dtype=torch.int32),
              torch.tensor([0, 1, 1, 0, 0, 3, 0, 9], dtype=torch.int32))


class TestMaskedCol2im(OpTester):
    op = "masked_im2col"
    exact = True             # a scatter where the later duplicate wins, and a gather back
    special_inputs = ("cols", "g")
    double_backward = True
    property_examples = {"torch": 25, "numba": 25, "triton": 5}
    bad_inputs = tuple(_bad(cvops.masked_col2im, args, match) for args, match in [
        ((torch.randn(2), GOOD_IDX, GOOD_IDX, 3, 3), "masked_output must be 2-D"),
        ((torch.randn(2, 3), GOOD_IDX, GOOD_IDX, 3, 3), r"masked_output dim 1 \(3\) must equal"),
        ((torch.randn(2, 2), GOOD_IDX, GOOD_IDX, -1, 3), "height must be >= 0"),
        ((torch.randn(2, 2), GOOD_IDX, GOOD_IDX, 3, 2.0), "width must be an int"),
        ((torch.randn(2, 2).int(), GOOD_IDX, GOOD_IDX, 3, 3), "masked_output dtype"),
        ((torch.randn(2, 2), GOOD_IDX.double(), GOOD_IDX, 3, 3), "mask_h_idx dtype"),
    ])

    def unit_cases(self):
        return []   # the cases file gathers columns; the scatter back has the small samples and the property test

    def small_samples(self, layout, dtype):
        s = col2im_sample(special_feature((1, 1, 3, 8), dtype).view(3, 8), *DUPLICATES, 5, 4)  # and outside the map
        return [s.replace(g=special_feature((1, 3, 5, 4), dtype, seed=1))]

    def special_samples(self, layout):
        return self.small_samples(layout, torch.float32)

    def grad_samples(self, layout):
        cols = torch.randn(3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        return [col2im_sample(cols, *GRAD_POINTS, 5, 4)]

    def zero_samples(self, layout):
        empty = torch.empty(0, dtype=torch.int32)
        return [(col2im_sample(torch.empty(5, 0), empty, empty, 4, 3), ((1, 5, 4, 3), (5, 0))),
                # an empty map drops every point
                (col2im_sample(torch.randn(2, 3), torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]), 0, 5),
                 ((1, 2, 0, 5), (2, 3)))]

    def run(self, s, backend):
        cols = s.cols.detach().requires_grad_()
        out = cvops.masked_col2im(cols, s.h, s.w, s.height, s.width, backend=backend)
        return out.detach(), *torch.autograd.grad(out, cols, s.g)

    def autograd(self, s, backend):
        return (lambda c: cvops.masked_col2im(c, s.h, s.w, s.height, s.width, backend=backend)), (s.cols,)

    def strategy(self, backend):
        return _calls(col2im=True)


# ------------------------------------------------------------------------------------------ forward
@requires_triton
def test_triton_doc_case_subsample():
    case = next(c for c in UNIT if c["name"] == "doc_case1_k3p1")
    feature, h, w, kernel, pad = case_inputs(case)
    feature, h, w = feature[:, :40], h[:70], w[:70]  # interpreter is slow: fewer channels and points
    assert bit_equal(cvops.masked_im2col(feature, h, w, kernel, pad, backend="triton"),
                     ref_im2col(feature, h, w, kernel, pad))


def test_sliced_half_and_expanded_feature(cpu_path):
    """A float16 view with a storage offset and channel and column steps, a feature expanded from one channel
    (stride 0), strided index tensors (the tester's non-contiguous views: float32, every dimension stepping by 2
    or transposed)."""
    big = special_feature((1, 12, 10, 15), torch.float16)
    h, w = random_points(40, -3, 13, torch.int32, seed=4)
    for view in (big[:, 1::3, 2:9, ::2], torch.randn(1, 1, 7, 5).expand(1, 6, 7, 5)):
        for kernel, pad in [((3, 3), (1, 1)), ((2, 5), (0, 3)), ((9, 2), (1, 0))]:
            assert bit_equal(cvops.masked_im2col(view, h[::2], w[1::2], kernel, pad),
                             ref_im2col(view, h[::2], w[1::2], kernel, pad)), (view.stride(), kernel)


@requires_numba
def test_numba_is_the_default_and_switchable(monkeypatch):
    from cvops._core.dispatch import resolve_backend
    feature, h, w = torch.randn(1, 2, 4, 4), torch.tensor([1]), torch.tensor([2])
    monkeypatch.setenv("CVOPS_NUMBA", "1")
    assert resolve_backend(cpu.__package__, "masked_im2col", None, feature.device, feature, h, w) == "numba"
    monkeypatch.setenv("CVOPS_NUMBA", "0")
    assert resolve_backend(cpu.__package__, "masked_im2col", None, feature.device, feature, h, w) == "torch"


@requires_numba
@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("dtype", FLOATS)
def test_numba_streaming_and_cached_stores_agree(dtype, streaming, monkeypatch):
    """The numba kernel writes large outputs with streaming stores, small ones with plain stores: both
    exact for every dtype, on interior and border points, serial and parallel."""
    from cvops.ops.masked_im2col import cpu_numba
    monkeypatch.setattr(cpu_numba, "STREAM_MIN_BYTES", 0 if streaming else 1 << 62)
    for shape, m in [((1, 5, 7, 9), 30), ((1, 64, 20, 24), 400)]:  # serial and parallel sizes
        feature = special_feature(shape, dtype)
        h, w = random_points(m, -3, 26, torch.int64, seed=m)
        for kernel, pad in [((3, 3), (1, 1)), ((1, 2), (0, 0)), ((11, 12), (2, 2))]:
            assert bit_equal(cvops.masked_im2col(feature, h, w, kernel, pad, backend="numba"),
                             ref_im2col(feature, h, w, kernel, pad)), (shape, kernel)


@requires_numba
@pytest.mark.parametrize("dtype", FLOATS)
def test_numba_backward_is_the_torch_backwards_bits(dtype):
    """The numba im2col backward makes the torch path's additions in its order: the same bits, for border,
    repeated and extreme points, every dtype, serial and parallel sizes, on 1 and 2 threads."""
    values = [I64_MIN, -2**62, -3, -1, 0, 1, 2, 5, 2**62, I64_MAX]
    extreme = (torch.tensor([v for v in values for _ in values]), torch.tensor([v for _ in values for v in values]))
    cases = [((1, 3, 7, 9), random_points(40, -3, 12, torch.int32, seed=1), (3, 3), (1, 1)),
             # 5.8e5 added values: the parallel path
             ((1, 64, 20, 24), random_points(1000, -2, 26, torch.int64, seed=2), (3, 3), (1, 1)),
             ((1, 4, 5, 6), random_points(30, -4, 10, torch.int64, seed=3), (2, 5), (3, 0)),
             ((1, 2, 3, 4), extreme, (3, 2), (0, 0))]
    threads = torch.get_num_threads()
    try:
        for shape, (h, w), kernel, pad in cases:
            grad_col = torch.randn(shape[1] * kernel[0] * kernel[1], h.shape[0]).to(dtype)
            grads = []
            for backend, count in (("torch", 1), ("numba", 1), ("numba", 2)):
                torch.set_num_threads(count)
                feature = torch.zeros(shape, dtype=dtype, requires_grad=True)
                cvops.masked_im2col(feature, h, w, kernel, pad, backend=backend).backward(grad_col)
                grads.append(feature.grad)
            assert bit_equal(grads[0], grads[1]) and bit_equal(grads[1], grads[2]), (shape, kernel, pad)
    finally:
        torch.set_num_threads(threads)


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


# ------------------------------------------------------------------------------------------ col2im

def test_col2im_later_duplicate_wins():
    """The reference's scatter (which the tester compares every backend with): the later duplicate wins."""
    h, w = DUPLICATES
    src = special_feature((1, 1, 3, 8), torch.float32).view(3, 8)
    out = cvops.masked_col2im(src, h, w, 5, 4, backend="reference")
    assert bit_equal(out[0, :, 0, 0], src[:, 6])
    assert bit_equal(out[0, :, 2, 1], src[:, 2])


# ------------------------------------------------------------------------------------------ autograd

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
    b = cvops.masked_conv2d(x, mask, weight, bias, 1, backend="torch")  # its own sum order
    assert torch.equal(a == 0, b == 0) and torch.allclose(a, b, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ int64 limits
I64_MIN, I64_MAX = -2**63, 2**63 - 1


@pytest.mark.parametrize("path", [*CPU_PATHS, pytest.param("triton", marks=requires_triton), "reference"])
def test_padding_that_would_overflow_int64_is_rejected(path):
    # 2**63 - 1 - (-2**63) wraps to -1 in int64 arithmetic; the next tap would then read column 0
    feature = torch.randn(1, 2, 3, 3)
    idx = torch.tensor([I64_MAX], dtype=torch.int64)
    backend = path
    for kernel, pad in (((2, 2), (I64_MIN, I64_MIN)), ((3, 3), (0, I64_MIN)), ((1, 1), (2**64, 0)),
                        ((3, 3), (2**63 - 5, 0))):
        with pytest.raises(BadParamError, match=r"padding .* must be < 2\*\*63"):
            cvops.masked_im2col(feature, idx, idx, kernel, pad, backend=backend)


@pytest.mark.parametrize("path", [*CPU_PATHS, pytest.param("triton", marks=requires_triton)])
def test_extreme_indices_within_the_padding_limit_match_the_reference(path):
    # every accepted (index, padding) pair gives the reference's exact result: window coordinates
    # near +-2**63 never wrap into the feature
    feature = special_feature((1, 2, 3, 4), torch.float32)
    values = [I64_MIN, I64_MIN + 1, -2**62, -1, 0, 1, 2, 2**62, I64_MAX - 1, I64_MAX]
    h = torch.tensor([v for v in values for _ in values], dtype=torch.int64)
    w = torch.tensor([v for _ in values for v in values], dtype=torch.int64)
    backend = path
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
