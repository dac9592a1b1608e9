"""carafe: the shared op tester's checks (every backend against the loop reference with diff1/diff2, in every
dtype and layout, contiguity, NaN and infinities, zero elements, bad input, autograd, opcheck, compile, export,
script) and what is carafe's own: hand-computed taps, an independent unfold formula, network scale, the
modules, float32 accumulation of half types, both cpu paths at the FPN shape (the MLU-OPS layer has a file of
its own)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

import cvops
from tests.support.cases import case_id, load_cases
from cvops._core.errors import BadParamError
from cvops.metrics import bit_equal, diff1, diff2
from tests.conftest import CPU_PATHS, requires_triton
from tests.support.op_tester import LAYOUTS, OpTester, Sample


def make(shape_nchw, layout, dtype=torch.float32, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape_nchw, generator=g, dtype=torch.float64)
    if positive:
        t = t.abs() + 0.1
    t = t.to(dtype)
    return t if layout == "NCHW" else t.permute(0, 2, 3, 1).contiguous()


def inputs(n, c, h, w, k, g, s, layout, dtype=torch.float32):
    x = make((n, c, h, w), layout, dtype, seed=1)
    m = make((n, g * k * k, h * s, w * s), layout, dtype, seed=2)
    gy = make((n, c, h * s, w * s), layout, dtype, seed=3)
    return x, m, gy


def sample(n, c, h, w, k, g, s, layout, dtype=torch.float32):
    x, m, gy = inputs(n, c, h, w, k, g, s, layout, dtype)
    return Sample(x=x, m=m, gy=gy, k=k, g=g, s=s, layout=layout)


def assert_close(actual, expected, tol):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert diff1(actual, expected) <= tol and diff2(actual, expected) <= tol, \
        (diff1(actual, expected), diff2(actual, expected))


def check_layers(backend, n, c, h, w, k, g, s, layout, dtype=torch.float32):
    """Forward and backward of one sample on ``backend`` against the reference (the tester's tolerance)."""
    TestCarafe().check(sample(n, c, h, w, k, g, s, layout, dtype), backend, what=str((n, c, h, w, k, g, s, layout)))


def unfold_composite(x, m, k, g, s):
    """An independent formula: unfold + nearest upsample + weighted sum (float64, NCHW)."""
    n, c, h, w = x.shape
    u = F.unfold(x, k, padding=(k - 1) // 2).view(n, g, c // g, k * k, h, w)
    u = u.repeat_interleave(s, 4).repeat_interleave(s, 5)
    return (u * m.view(n, g, 1, k * k, h * s, w * s)).sum(3).view(n, c, h * s, w * s)


_X, _M = (1, 4, 3, 3), (1, 9, 6, 6)


def _bad_scalars(k, g, s, rule):
    return (f"k={k} g={g} s={s}", lambda b: cvops.carafe(torch.randn(_X), torch.randn(_M), k, g, s, backend=b),
            BadParamError, rule)


def _bad_shapes(x_shape, m_shape, g, rule):
    return (f"{x_shape} {m_shape} g={g}",
            lambda b: cvops.carafe(torch.randn(x_shape), torch.randn(m_shape), 3, g, 2, backend=b), BadParamError, rule)


def _bad_call(name, call, rule):
    return (name, lambda b: call(torch.randn(_X), torch.randn(_M), torch.randn(1, 4, 6, 6), b), BadParamError, rule)


class TestCarafe(OpTester):
    op = "carafe"
    exact = False
    layouts = LAYOUTS
    special_inputs = ("x", "m", "gy")
    pointwise = (1e-5, 1e-5)   # with NaN and inf planted, the finite float32/float64 results within 1e-5 pointwise
    double_backward = True
    # the full Jacobians on the numba path; the loop reference and the torch path take seconds per call of them
    gradcheck_fast = ("reference", "torch", "triton")
    gradgradcheck_fast = ("reference", "torch")
    property_examples = {"torch": 12, "numba": 12, "triton": 4}
    bad_inputs = (
        _bad_scalars(4, 1, 2, "kernel_size must be odd"), _bad_scalars(0, 1, 2, "kernel_size must be >= 1"),
        _bad_scalars(-3, 1, 2, "kernel_size must be >= 1"), _bad_scalars(3, 0, 2, "group_size must be >= 1"),
        _bad_scalars(3, 1, 0, "scale_factor must be >= 1"), _bad_scalars(3.0, 1, 2, "kernel_size must be an int"),
        _bad_scalars(3, True, 2, "group_size must be an int"), _bad_scalars(3, 1, 2.0, "scale_factor must be an int"),
        _bad_shapes((1, 6, 3, 3), (1, 36, 6, 6), 4, r"features channels \(6\) must be divisible by group_size \(4\)"),
        _bad_shapes((1, 4, 3, 3), (1, 8, 6, 6), 1, r"masks channels \(8\) must equal group_size \* kernel_size\^2"),
        _bad_shapes((1, 4, 3, 3), (1, 9, 6, 5), 1,
                    r"masks spatial size \(6, 5\) must equal features size \* scale_factor \(6, 6\)"),
        _bad_shapes((1, 4, 3, 3), (1, 9, 3, 3), 1, "masks spatial size"),
        _bad_shapes((2, 4, 3, 3), (1, 9, 6, 6), 1, r"masks batch \(1\) must equal features batch \(2\)"),
        _bad_shapes((4, 3, 3), (1, 9, 6, 6), 1, "features must be 4-D"),
        _bad_shapes((1, 4, 3, 3), (9, 6, 6), 1, "masks must be 4-D"),
        _bad_call("masks dtype", lambda x, m, gy, b: cvops.carafe(x, m.double(), 3, 1, 2, backend=b), "masks dtype"),
        _bad_call("int features", lambda x, m, gy, b: cvops.carafe(x.int(), m.int(), 3, 1, 2, backend=b),
                  "features dtype must be one of"),
        _bad_call("numpy features", lambda x, m, gy, b: cvops.carafe(x.numpy(), m, 3, 1, 2, backend=b),
                  "features must be a torch.Tensor"),
        _bad_call("layout", lambda x, m, gy, b: cvops.carafe(x, m, 3, 1, 2, layout="HWCN", backend=b),
                  "layout must be"),
        _bad_call("backend", lambda x, m, gy, b: cvops.carafe(x, m, 3, 1, 2, backend="cuda"), "backend must be one of"),
        _bad_call("grad_output width",
                  lambda x, m, gy, b: cvops.carafe_backward(gy[:, :, :5], x, m, 3, 1, 2, backend=b),
                  "grad_output shape"),
        _bad_call("grad_output channels",
                  lambda x, m, gy, b: cvops.carafe_backward(torch.randn(1, 3, 6, 6), x, m, 3, 1, 2, backend=b),
                  "grad_output shape"),
        _bad_call("grad_output dtype", lambda x, m, gy, b: cvops.carafe_backward(gy.double(), x, m, 3, 1, 2, backend=b),
                  "grad_output dtype"),
        _bad_call("backward kernel", lambda x, m, gy, b: cvops.carafe_backward(gy, x, m, 2, 1, 2, backend=b),
                  "kernel_size must be odd"),
        # NHWC shapes are read as NHWC: an NCHW tensor passed as NHWC fails the mask size rule
        _bad_call("NCHW as NHWC", lambda x, m, gy, b: cvops.carafe(x, m, 3, 1, 2, layout="NHWC", backend=b), "masks"),
    )

    def case_samples(self, case, layout, dtype):
        return [sample(case["N"], case["C"], case["H"], case["W"], case["kernel_size"], case["group_size"],
                       case["scale_factor"], layout, dtype)]

    def interpretable(self, case):
        size = case["N"] * case["C"] * case["H"] * case["W"] * case["scale_factor"] ** 2
        return size <= 6000 and case["kernel_size"] <= 7

    def small_samples(self, layout, dtype):
        return [sample(2, 8, 3, 4, 3, 2, 2, layout, dtype)]

    def special_samples(self, layout):
        x, m, gy = inputs(1, 4, 3, 4, 5, 2, 2, "NCHW")
        m[0, 0] = float("inf")             # tap (0, 0): outside the map for the top rows -> skipped there
        x[0, 1, 1, 1] = float("nan")
        gy[0, 2, 5, 5] = float("inf")
        to = (lambda t: t) if layout == "NCHW" else (lambda t: t.permute(0, 2, 3, 1).contiguous())
        return [Sample(x=to(x), m=to(m), gy=to(gy), k=5, g=2, s=2, layout=layout)]

    def deterministic_samples(self, layout, backend):
        # on the cpu a size that takes the parallel paths
        shape = (2, 64, 12, 10) if backend in ("torch", "numba") else (1, 8, 3, 4)
        return [sample(*shape, 5, 4, 2, layout)]

    def grad_samples(self, layout):
        # the first (one group, two channels) is the Triton interpreter's
        return [sample(1, 2, 2, 3, 3, 1, 2, layout, torch.float64), sample(2, 4, 3, 3, 3, 2, 2, layout, torch.float64)]

    def gradgrad_samples(self, layout):
        return [sample(1, 4, 3, 3, 3, 2, 2, layout, torch.float64)]

    def zero_samples(self, layout):
        result = []
        for n, c, h, w in ((0, 4, 3, 3), (2, 0, 3, 3), (2, 4, 0, 3), (2, 4, 3, 0)):
            s = sample(n, c, h, w, 3, 2, 2, layout)
            out = (n, c, 2 * h, 2 * w) if layout == "NCHW" else (n, 2 * h, 2 * w, c)
            result.append((s, (out, s.x.shape, s.m.shape)))
        return result

    def run(self, s, backend):
        return (cvops.carafe_forward(s.x, s.m, s.k, s.g, s.s, s.layout, backend=backend),
                *cvops.carafe_backward(s.gy, s.x, s.m, s.k, s.g, s.s, s.layout, backend=backend))

    def autograd(self, s, backend):
        return (lambda x, m: cvops.carafe(x, m, s.k, s.g, s.s, s.layout, backend=backend)), (s.x, s.m)

    def module(self, s):
        return (cvops.nn.CARAFE(s.k, s.g, s.s), (s.x, s.m)) if s.layout == "NCHW" else None

    def strategy(self, backend):
        if backend == "triton":
            return st.builds(sample, n=st.just(1), c=st.just(4), h=st.integers(1, 4), w=st.integers(1, 4),
                             k=st.sampled_from([1, 3, 5]), g=st.just(2), s=st.integers(1, 3),
                             layout=st.sampled_from(LAYOUTS))
        return st.builds(lambda n, cg, g, **kw: sample(n, cg * g, g=g, dtype=torch.float64, **kw),
                         n=st.integers(1, 2), cg=st.integers(1, 3), g=st.integers(1, 3), h=st.integers(1, 5),
                         w=st.integers(1, 5), k=st.sampled_from([1, 3, 5, 7]), s=st.integers(1, 3),
                         layout=st.sampled_from(LAYOUTS))

    def tolerance(self, dtype, backend):
        if dtype == torch.float64:
            return 1e-12
        if dtype == torch.float32:
            return 3e-6
        if dtype == torch.bfloat16 and backend == "triton" and cvops._core.dispatch.triton_interpreted():
            # the interpreter converts float32 -> bfloat16 by truncation (GPUs round to nearest even),
            # which costs up to one bfloat16 ulp (2^-8 relative) per element
            return 8e-3
        return 3e-3


# -------------------------------------------------------------------------------- the semantics itself
def test_hand_computed_taps_and_channel_order():
    # k=3, G=2, s=2: group 1 puts all weight on tap (ky=0, kx=2) = mask channel (1*3 + 0)*3 + 2 = 11,
    # i.e. the pixel up-right of the block; group 0 on the centre tap (channel 4): nearest upsampling.
    x = torch.arange(2 * 3 * 3, dtype=torch.float64).view(1, 2, 3, 3)
    m = torch.zeros(1, 18, 6, 6, dtype=torch.float64)
    m[:, 4] = 1
    m[:, 11] = 2
    out = cvops.carafe(x, m, 3, 2, 2, backend="reference")
    for backend in ("cpu", "reference"):
        out = cvops.carafe(x, m, 3, 2, 2, backend=backend)
        assert torch.equal(out[0, 0], x[0, 0].repeat_interleave(2, 0).repeat_interleave(2, 1))
        shifted = torch.zeros(3, 3, dtype=torch.float64)
        shifted[1:, :2] = x[0, 1, :2, 1:]  # out block (i, j) reads x[i-1, j+1], zero outside
        assert torch.equal(out[0, 1], 2 * shifted.repeat_interleave(2, 0).repeat_interleave(2, 1))


def test_matches_unfold_composite():
    x, m, _ = inputs(2, 6, 5, 7, 5, 3, 3, "NCHW", torch.float64)
    assert_close(cvops.carafe(x, m, 5, 3, 3), unfold_composite(x, m, 5, 3, 3), 1e-13)


def test_large_kernel_beyond_mlu_limit_in_functional_api():
    # k = 47 > 45 is NOT_SUPPORTED in the MLU-OPS layer only; the functional API computes it.
    check_layers("cpu", 1, 2, 2, 3, 47, 1, 1, "NCHW", torch.float64)


@pytest.mark.slow
@pytest.mark.parametrize("case", load_cases("carafe", "network")[:1], ids=case_id)
def test_network_scale_cpu_matches_composite(case):
    # FPN scale (C=256, 100x152, k5 G1 s2) with batch 1; the loop reference is far too slow here,
    # so the oracles are independent float64 formulas: the unfold composite (with autograd) on two
    # channel slices for output and grad_input, and a per-tap channel sum for grad_mask.
    n, c, h, w, k, g, s = 1, case["C"], case["H"], case["W"], case["kernel_size"], case["group_size"], case["scale_factor"]
    r = (k - 1) // 2
    x, m, gy = inputs(n, c, h, w, k, g, s, "NCHW")
    out = cvops.carafe(x, m, k, g, s)
    gi, gm = cvops.carafe_backward(gy, x, m, k, g, s)
    for c0 in (0, c - 16):
        xs = x[:, c0:c0 + 16].double().requires_grad_()
        ref = unfold_composite(xs, m.double(), k, 1, s)
        assert diff1(out[:, c0:c0 + 16], ref) <= 1e-6 and diff2(out[:, c0:c0 + 16], ref) <= 1e-6
        (gxs,) = torch.autograd.grad(ref, xs, gy[:, c0:c0 + 16].double())
        assert diff1(gi[:, c0:c0 + 16], gxs) <= 1e-6 and diff2(gi[:, c0:c0 + 16], gxs) <= 1e-6
    xp = F.pad(x[0].double(), (r, r, r, r))
    gyd = gy[0].double()
    for t in (0, k - 1, (k * k) // 2, k * k - k, k * k - 1, 7):   # corners, centre, one inner tap
        ky, kx = divmod(t, k)
        tap = xp[:, ky:ky + h, kx:kx + w].repeat_interleave(s, 1).repeat_interleave(s, 2)
        expected = (gyd * tap).sum(0)
        assert diff1(gm[0, t], expected) <= 1e-6 and diff2(gm[0, t], expected) <= 1e-6


# -------------------------------------------------------------------------------- autograd, determinism
def test_gradcheck_mmcv_shape():
    # mmcv's own gradcheck: feat (2, 64, 3, 3), CARAFE(5, 4, 2), double
    x, m, _ = inputs(2, 64, 3, 3, 5, 4, 2, "NCHW", torch.float64)
    x.requires_grad_(); m.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: cvops.carafe(a, b, 5, 4, 2), (x, m), fast_mode=True,
                                    atol=1e-4, eps=1e-4)


def test_autograd_equals_explicit_backward():
    x, m, gy = inputs(2, 8, 4, 5, 5, 2, 2, "NHWC")
    xr, mr = x.clone().requires_grad_(), m.clone().requires_grad_()
    cvops.carafe(xr, mr, 5, 2, 2, layout="NHWC").backward(gy)
    gi, gm = cvops.carafe_backward(gy, x, m, 5, 2, 2, layout="NHWC")
    assert bit_equal(xr.grad, gi) and bit_equal(mr.grad, gm)


# -------------------------------------------------------------------------------- modules
def test_carafe_modules_match_mmcv_signature():
    for cls in (cvops.nn.CARAFE, cvops.nn.CARAFENaive):
        mod = cls(5, 4, 2)
        assert (mod.kernel_size, mod.group_size, mod.scale_factor) == (5, 4, 2)
        x, m, _ = inputs(2, 64, 3, 3, 5, 4, 2, "NCHW")
        assert_close(mod(x, m), cvops.carafe(x, m, 5, 4, 2, backend="reference"), 3e-6)
        with pytest.raises(BadParamError, match="kernel_size must be an int"):
            cls(5.0, 4, 2)


def test_carafe_pack_structure_init_and_forward():
    torch.manual_seed(0)
    pack = cvops.nn.CARAFEPack(32, 2)
    assert (pack.up_kernel, pack.up_group, pack.encoder_kernel, pack.encoder_dilation, pack.compressed_channels) == (5, 1, 3, 1, 64)
    assert pack.channel_compressor.kernel_size == (1, 1) and pack.channel_compressor.out_channels == 64
    enc = pack.content_encoder
    assert enc.out_channels == 5 * 5 * 1 * 2 * 2 and enc.kernel_size == (3, 3) and enc.padding == (1, 1)
    assert enc.weight.std() < 0.002 and not enc.bias.any() and not pack.channel_compressor.bias.any()
    bound = (6 / (32 + 64)) ** 0.5   # xavier uniform of the 1x1 compressor
    assert pack.channel_compressor.weight.abs().max() <= bound
    x = torch.randn(2, 32, 5, 6)
    out = pack(x)
    assert out.shape == (2, 32, 10, 12)
    mask = F.softmax(F.pixel_shuffle(enc(pack.channel_compressor(x)), 2).view(2, 1, 25, 10, 12), 2).view(2, 25, 10, 12)
    assert_close(out, cvops.carafe(x, mask, 5, 1, 2, backend="reference"), 3e-6)
    dil = cvops.nn.CARAFEPack(16, 3, up_kernel=3, up_group=2, encoder_kernel=5, encoder_dilation=2, compressed_channels=8)
    assert dil.content_encoder.padding == (4, 4) and dil.content_encoder.out_channels == 3 * 3 * 2 * 9
    y = torch.randn(1, 16, 4, 3, requires_grad=True)
    out = dil(y)
    assert out.shape == (1, 16, 12, 9)
    out.sum().backward()
    assert y.grad is not None and dil.content_encoder.weight.grad is not None


def test_cpu_under_inference_mode_and_thread_count_restored():
    x, m, gy = inputs(2, 8, 6, 5, 3, 2, 2, "NCHW")
    threads = torch.get_num_threads()
    expected = cvops.carafe(x, m, 3, 2, 2, backend="reference")
    with torch.inference_mode():
        assert_close(cvops.carafe(x, m, 3, 2, 2), expected, 3e-6)
    with torch.no_grad():
        assert_close(cvops.carafe_backward(gy, x, m, 3, 2, 2)[1],
                     cvops.carafe_backward(gy, x, m, 3, 2, 2, backend="reference")[1], 3e-6)
    assert torch.get_num_threads() == threads


# -------------------------------------------------------------------------------- half precision at network size
def _half_accumulating(x, m, gy, k, s):
    """What a kernel that accumulates in the input dtype computes (every add rounded to fp16/bf16):
    the variant the tolerance of :func:`test_half_precision_accumulates_in_float32` must reject."""
    dt, (n, c, h, w), r = x.dtype, x.shape, (k - 1) // 2
    xp = F.pad(x.float(), (r, r, r, r)).to(dt)
    out = torch.zeros(n, c, h * s, w * s, dtype=dt)
    gm = torch.zeros_like(m)
    gxp = torch.zeros(n, c, h + 2 * r, w + 2 * r, dtype=dt)
    for ky in range(k):
        for kx in range(k):
            t = ky * k + kx
            win = xp[:, :, ky:ky + h, kx:kx + w].repeat_interleave(s, 2).repeat_interleave(s, 3)
            out = out + win * m[:, t:t + 1]
            acc = torch.zeros(n, h * s, w * s, dtype=dt)
            for ch in range(c):
                acc = acc + win[:, ch] * gy[:, ch]
            gm[:, t] = acc
            for py in range(s):
                for px in range(s):
                    gxp[:, :, ky:ky + h, kx:kx + w] += m[:, t:t + 1, py::s, px::s] * gy[:, :, py::s, px::s]
    return out, gxp[:, :, r:r + h, r:r + w], gm


HALF_TOL = 5e-5  # float32 accumulation + one rounding: <= 1e-5 here; half accumulation: >= 5e-4 (fp16), 4e-3 (bf16)


def _half_case(dtype):
    # C = 64, k = 5, s = 2 (CARAFEPack's defaults): 25 taps in the forward, 64 channels per grad_mask
    # entry and 100 (tap, phase) terms per grad_input entry, with softmax-normalised masks
    n, c, h, w, k, s = 1, 64, 6, 6, 5, 2
    x = make((n, c, h, w), "NCHW", dtype, seed=11)
    m = make((n, k * k, h * s, w * s), "NCHW", torch.float64, seed=12).softmax(1).to(dtype)
    gy = make((n, c, h * s, w * s), "NCHW", dtype, seed=13)
    expected = (cvops.carafe_forward(x, m, k, 1, s, backend="reference"),
                *cvops.carafe_backward(gy, x, m, k, 1, s, backend="reference"))
    return (x, m, gy, k, s), expected


def _check_half(backends, args, expected):
    x, m, gy, k, s = args
    for backend in backends:
        actual = (cvops.carafe_forward(x, m, k, 1, s, backend=backend),
                  *cvops.carafe_backward(gy, x, m, k, 1, s, backend=backend))
        for what, a, e in zip(("output", "grad_input", "grad_mask"), actual, expected):
            assert diff1(a, e) <= HALF_TOL and diff2(a, e) <= HALF_TOL, (backend, what, diff1(a, e), diff2(a, e))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32(dtype):
    from tests.conftest import installed_cpu_paths
    args, expected = _half_case(dtype)
    for a, e in zip(_half_accumulating(*args), expected):  # the tolerance tells the two apart
        assert diff1(a, e) > 2 * HALF_TOL and diff2(a, e) > 2 * HALF_TOL
    _check_half(installed_cpu_paths(), args, expected)


@pytest.mark.slow
@requires_triton
def test_half_precision_accumulates_in_float32_triton():
    # float16 only: the interpreter truncates float32 -> bfloat16 (see tol_of), an error the size of
    # bfloat16 accumulation; on a GPU the cast rounds. About 6 s under the interpreter.
    _check_half(["triton"], *_half_case(torch.float16))


# -------------------------------------------------------------------------------- both cpu paths (speed work)
@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpu_paths_ragged_channels_match_reference(path, layout):
    """Each cpu path (the vectorised torch path and the numba loops) on channel counts that are not a multiple of
    the 8-lane transpose, at the borders (the unit cases and dtypes are the tester's)."""
    check_layers(path, 1, 13, 9, 11, 5, 1, 2, layout, torch.float64)   # 13 channels, 22 columns
    check_layers(path, 1, 20, 2, 9, 3, 4, 3, layout)


@pytest.mark.parametrize("path", CPU_PATHS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpu_paths_deterministic_and_agree_at_fpn_shape(path, layout, monkeypatch):
    """A CARAFE-FPN upsampler (C 256, k5, s2) on a small map: both directions bit-identical on one
    thread and on the pool (for numba: spans of one row, so every span boundary falls inside an
    image and regroups the rows beyond it), and within tolerance of the other cpu path."""
    if path == "numba":
        from cvops.ops.carafe import cpu_numba
        monkeypatch.setattr(cpu_numba, "_PARALLEL_WORK", 0)  # the pool even for this small call
        monkeypatch.setattr(cpu_numba, "_FORWARD_ROWS", 1)
        monkeypatch.setattr(cpu_numba, "_BACKWARD_ROWS", 1)
    x, m, gy = inputs(2, 256, 7, 10, 5, 1, 2, layout)
    m = (m.softmax(3) if layout == "NHWC" else m.view(2, 1, 25, 14, 20).softmax(2).view(2, 25, 14, 20))
    out = cvops.carafe(x, m, 5, 1, 2, layout, backend=path)
    first = cvops.carafe_backward(gy, x, m, 5, 1, 2, layout, backend=path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single_out = cvops.carafe(x, m, 5, 1, 2, layout, backend=path)
        single = cvops.carafe_backward(gy, x, m, 5, 1, 2, layout, backend=path)
    finally:
        torch.set_num_threads(threads)
    assert bit_equal(out, single_out)
    assert all(bit_equal(a, b) for a, b in zip(first, single))
    other = "torch" if path == "numba" else "numba"
    if other == "numba" and not cvops._core.jit.numba_available():
        return
    assert_close(out, cvops.carafe(x, m, 5, 1, 2, layout, backend=other), 3e-6)
    for a, b in zip(first, cvops.carafe_backward(gy, x, m, 5, 1, 2, layout, backend=other)):
        assert_close(a, b, 3e-6)
