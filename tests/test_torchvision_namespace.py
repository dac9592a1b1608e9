"""cvops.torchvision: torchvision.ops' ps_roi_pool / PSRoIPool (signature, defaults, return type, numerics), checked
against a loop written here from torchvision's forward formula, and the torchvision convention of the native op."""
import inspect
import math

import numpy as np
import pytest
import torch

import cvops
from cvops._core.errors import BadParamError
from cvops.metrics import bit_equal, diff1, diff2
from tests.conftest import CPU_PATHS, default_to, requires_triton

BACKENDS = ["reference", *CPU_PATHS, pytest.param("triton", marks=requires_triton)]
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def _round(v: np.float32) -> int:
    """C ``round``: half away from zero (exact for a float32 value in float64)."""
    return int(math.copysign(math.floor(abs(float(v)) + 0.5), float(v)))


def tv_loop(x: torch.Tensor, rois: torch.Tensor, ph_n: int, pw_n: int, scale: float) -> torch.Tensor:
    """torchvision's ps_roi_pool forward as documented in its kernel, float32 arithmetic, rows then columns."""
    f = np.float32
    n, c, h, w = x.shape
    od = c // (ph_n * pw_n)
    data = x.float().numpy()
    out = np.zeros((len(rois), od, ph_n, pw_n), np.float32)
    for i, roi in enumerate(rois.float().numpy()):
        b = int(roi[0])
        start_w, start_h = _round(f(roi[1]) * f(scale)), _round(f(roi[2]) * f(scale))
        size_w = max(_round(f(roi[3]) * f(scale)) - start_w, 1)
        size_h = max(_round(f(roi[4]) * f(scale)) - start_h, 1)
        bin_h, bin_w = f(size_h) / f(ph_n), f(size_w) / f(pw_n)
        for ctop in range(od):
            for ph in range(ph_n):
                for pw in range(pw_n):
                    hs = min(max(math.floor(f(ph) * bin_h) + start_h, 0), h - 1)
                    he = min(max(math.ceil(f(ph + 1) * bin_h) + start_h, 0), h - 1)
                    ws = min(max(math.floor(f(pw) * bin_w) + start_w, 0), w - 1)
                    we = min(max(math.ceil(f(pw + 1) * bin_w) + start_w, 0), w - 1)
                    if he <= hs or we <= ws:
                        continue
                    total = f(0)
                    for y in range(hs, he):
                        for xx in range(ws, we):
                            total = f(total + data[b, (ctop * ph_n + ph) * pw_n + pw, y, xx])
                    out[i, ctop, ph, pw] = total / f((he - hs) * (we - ws))
    return torch.from_numpy(out).to(x.dtype)


def close(a, b, tol=3e-3):
    return a.shape == b.shape and diff1(a, b) <= tol and diff2(a, b) <= tol and torch.equal(a == 0, b == 0)


# half-pixel corners after scaling (x.5 rounds away from zero), negative corners, RoIs smaller than a pixel,
# x2 < x1, RoIs touching and crossing the last row/column, a RoI outside the map
ROIS = torch.tensor([
    [0, 1.0, 3.0, 9.0, 7.0],      # scale 0.5: 0.5 -> 1, 1.5 -> 2, 4.5 -> 5, 3.5 -> 4
    [1, -1.0, -3.0, 5.0, 4.99],   # -0.5 -> -1, -1.5 -> -2
    [0, 4.2, 4.2, 4.4, 4.4],      # less than a pixel: size 1
    [1, 8.0, 6.0, 2.0, 1.0],      # x2 < x1: size 1
    [0, 0.0, 0.0, 40.0, 40.0],    # the whole map and beyond: the last row/column are clamped away
    [1, 12.0, 8.0, 22.0, 15.0],   # the bottom-right corner
    [0, 60.0, 60.0, 80.0, 80.0],  # outside: every bin empty
])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("output_size", [3, (2, 3), (4, 1)])
def test_forward_matches_torchvision_formula(backend, output_size, monkeypatch):
    if backend in ("torch", "numba"):
        default_to(backend, monkeypatch)  # cvops.torchvision runs the default backend
    ph, pw = (output_size, output_size) if isinstance(output_size, int) else output_size
    x = torch.randn(2, 2 * ph * pw, 9, 13, generator=torch.Generator().manual_seed(ph * 10 + pw))
    expected = tv_loop(x, ROIS, ph, pw, 0.5)
    out, mapping = cvops.psroi_pool(x, ROIS, ph, pw, 0.5, ph if ph == pw else 1, 2, backend=backend,
                                    convention="torchvision")
    assert close(out, expected)
    if backend in ("reference", "numba"):  # the same sums
        assert bit_equal(out, expected)
    assert mapping.flatten(1).tolist()[0] == list(range(2 * ph * pw))
    assert torch.equal(cvops.torchvision.ps_roi_pool(x, ROIS, output_size, 0.5), out)


@pytest.mark.parametrize("backend", ["reference", *CPU_PATHS])
def test_last_row_and_column_are_never_read(backend):
    # torchvision's forward clamps the bin edges to [0, H - 1] / [0, W - 1]
    x = torch.randn(1, 4, 6, 7)
    rois = torch.tensor([[0, 0.0, 0.0, 7.0, 6.0], [0, 6.0, 5.0, 7.0, 6.0]])
    out = cvops.psroi_pool(x, rois, 2, 2, 1.0, 2, 1, backend=backend, convention="torchvision")[0]
    exact = backend in ("reference", "numba")  # the torch backend sums through a table
    y = x.clone()
    y[:, :, -1], y[:, :, :, -1] = (1e6, 1e6) if exact else (10.0, 10.0)
    other = cvops.psroi_pool(y, rois, 2, 2, 1.0, 2, 1, backend=backend, convention="torchvision")[0]
    assert torch.equal(other, out) if exact else close(other, out)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # its bins lie on the last row/column only: empty


@pytest.mark.parametrize("backend", ["reference", *CPU_PATHS])
def test_backward_is_the_adjoint_and_gradcheck(backend, monkeypatch):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 36, 9, 13, dtype=torch.float64, generator=gen)
    for ph, pw in ((2, 3), (3, 3)):
        od = 36 // (ph * pw)
        out, mapping = cvops.psroi_pool(x, ROIS.double(), ph, pw, 0.5, ph if ph == pw else 1, od, backend=backend,
                                        convention="torchvision")
        g = torch.randn(out.shape, dtype=torch.float64, generator=gen)
        grad = cvops.psroi_pool_backward(g, ROIS.double(), mapping, 0.5, od, tuple(x.shape), backend=backend,
                                         convention="torchvision")
        assert abs(float((out * g).sum()) - float((x * grad).sum())) < 1e-9
        assert float(grad[:, :, -1].abs().sum() + grad[:, :, :, -1].abs().sum()) == 0.0
    if backend in ("torch", "numba"):
        default_to(backend, monkeypatch)  # cvops.torchvision runs the default backend
        t = x.clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda v: cvops.torchvision.ps_roi_pool(v, ROIS.double(), (2, 3), 0.5), (t,))


def test_boxes_as_a_list_and_the_module():
    x = torch.randn(2, 18, 9, 13)
    boxes = [ROIS[ROIS[:, 0] == 0, 1:], ROIS[ROIS[:, 0] == 1, 1:]]
    rois = torch.cat([torch.cat([torch.full((len(b), 1), float(i)), b], 1) for i, b in enumerate(boxes)])
    out = cvops.torchvision.ps_roi_pool(x, boxes, 3, 0.5)
    assert isinstance(out, torch.Tensor) and out.shape == (len(rois), 2, 3, 3)
    assert torch.equal(out, cvops.torchvision.ps_roi_pool(x, rois, 3, 0.5))
    module = cvops.torchvision.PSRoIPool(output_size=3, spatial_scale=0.5)
    assert torch.equal(module(x, boxes), out)
    assert repr(module) == "PSRoIPool(output_size=3, spatial_scale=0.5)"


def test_a_box_list_of_several_dtypes_is_promoted_as_torch_cat_promotes(cpu_path):
    # issue 33: a float16 first box cast the float32 boxes after it to float16 (x1 = 1000.45 became 1000.5,
    # which rounds to 1001: other bins); torchvision concatenates the list with torch.cat's type promotion
    x = torch.randn(1, 4, 6, 1010, generator=torch.Generator().manual_seed(0))
    boxes = [torch.tensor([[0.0, 0, 8, 4]], dtype=torch.float16), torch.tensor([[1000.45, 0.0, 1005.2, 5.0]])]
    rois = torch.tensor([[0, 0.0, 0, 8, 4], [1, 1000.45, 0.0, 1005.2, 5.0]])  # float32, as torch.cat gives
    x2 = torch.cat([x, x])
    got = cvops.torchvision.ps_roi_pool(x2, boxes, 2)
    assert torch.equal(got, cvops.torchvision.ps_roi_pool(x2, rois, 2))
    assert close(got, tv_loop(x2, rois, 2, 2, 1.0))
    assert not torch.equal(got, cvops.torchvision.ps_roi_pool(x2, rois.half().float(), 2))  # the cast matters here


@pytest.mark.parametrize("output_size", [2.5, (3.0, 3.0), (2, 2.5), (2, 2, 2), "ab"])
def test_output_size_is_ints_as_torchvisions_op_takes(output_size):
    # issue 33: 2.5 or (3.0, 3.0) were truncated silently; torchvision's op refuses a float (a RuntimeError)
    with pytest.raises(RuntimeError, match="output_size must be an int or a pair of ints") as caught:
        cvops.torchvision.ps_roi_pool(torch.randn(1, 9, 5, 5), torch.tensor([[0.0, 0, 0, 4, 4]]), output_size)
    assert isinstance(caught.value, BadParamError)
    with pytest.raises(RuntimeError, match="output_size"):
        cvops.torchvision.PSRoIPool(output_size, 1.0)(torch.randn(1, 9, 5, 5), torch.tensor([[0.0, 0, 0, 4, 4]]))


@pytest.mark.parametrize("boxes", [torch.zeros(0, 5), [torch.zeros(0, 4)], [torch.zeros(0, 4), torch.zeros(0, 4)], []],
                         ids=["tensor", "list1", "list2", "no-images"])
def test_no_boxes_give_an_empty_output(boxes, cpu_path):
    # issue 33: zero boxes raised BadParamError; torchvision returns Tensor[0, C / (PH * PW), PH, PW] (for an
    # empty list torchvision raises, torch.cat of nothing; cvops returns the same empty output)
    x = torch.randn(2, 12, 5, 6, dtype=torch.float64, requires_grad=True)
    out = cvops.torchvision.ps_roi_pool(x, boxes, (2, 3), 0.5)
    assert out.shape == (0, 2, 2, 3) and out.dtype == x.dtype
    out.sum().backward()
    assert x.grad is not None and not x.grad.any()
    assert cvops.torchvision.PSRoIPool((2, 3), 0.5)(x, boxes).shape == (0, 2, 2, 3)
    with pytest.raises(RuntimeError, match=r"input channels \(12\) must be a multiple"):  # still checked
        cvops.torchvision.ps_roi_pool(x, boxes, 5)


def test_signatures_and_defaults_are_torchvisions():
    sig = inspect.signature(cvops.torchvision.ps_roi_pool)
    assert list(sig.parameters) == ["input", "boxes", "output_size", "spatial_scale"]
    assert sig.parameters["spatial_scale"].default == 1.0
    assert all(p.default is inspect.Parameter.empty for name, p in sig.parameters.items() if name != "spatial_scale")
    init = inspect.signature(cvops.torchvision.PSRoIPool.__init__)
    assert list(init.parameters) == ["self", "output_size", "spatial_scale"]
    assert list(inspect.signature(cvops.torchvision.PSRoIPool.forward).parameters) == ["self", "input", "rois"]
    x = torch.randn(1, 4, 5, 5)
    assert torch.equal(cvops.torchvision.ps_roi_pool(x, torch.tensor([[0.0, 0, 0, 4, 4]]), 2),
                       cvops.torchvision.ps_roi_pool(x, torch.tensor([[0.0, 0, 0, 4, 4]]), (2, 2), 1.0))


def test_bad_arguments():
    x = torch.randn(1, 8, 5, 5)
    with pytest.raises(BadParamError, match=r"input channels \(8\) must be a multiple of .* \(9\)"):
        cvops.torchvision.ps_roi_pool(x, torch.tensor([[0.0, 0, 0, 4, 4]]), 3)
    with pytest.raises(BadParamError, match=r"boxes\[0\] must be \[L, 4\]"):
        cvops.torchvision.ps_roi_pool(x, [torch.zeros(1, 5)], 2)
    with pytest.raises(BadParamError, match="is not a finite coordinate"):
        cvops.torchvision.ps_roi_pool(x, torch.tensor([[0.0, 0, float("nan"), 4, 4]]), 2)
    with pytest.raises(BadParamError, match="convention must be"):
        cvops.psroi_pool(x, torch.tensor([[0.0, 0, 0, 4, 4]]), 2, 2, 1.0, 2, 2, convention="caffe")


@pytest.mark.parametrize("boxes", [torch.tensor([[0.0, 0, 3, 3]]), [torch.tensor([[0.0, 0, 3]])]], ids=["4", "list3"])
def test_bad_boxes_are_the_assertion_errors_torchvision_raises(boxes):
    x = torch.linspace(1, 64, 64).reshape(1, 1, 8, 8)
    with pytest.raises(AssertionError, match="ps_roi_pool: boxes") as caught:
        cvops.torchvision.ps_roi_pool(x, boxes, output_size=(2, 2))
    assert isinstance(caught.value, BadParamError) and caught.value.status == BadParamError.status
    assert not isinstance(caught.value, RuntimeError)


def test_other_bad_arguments_are_runtime_errors_as_in_torchvision():
    with pytest.raises(RuntimeError, match=r"input channels \(8\) must be a multiple") as caught:
        cvops.torchvision.ps_roi_pool(torch.randn(1, 8, 5, 5), torch.tensor([[0.0, 0, 0, 4, 4]]), 3)
    assert isinstance(caught.value, BadParamError) and not isinstance(caught.value, AssertionError)
    with pytest.raises(BadParamError) as native:  # the native API stays a plain BadParamError
        cvops.psroi_pool(torch.randn(1, 8, 5, 5), torch.tensor([[0.0, 0, 0, 4, 4]]), 3, 3, 1.0, 3, 1)
    assert not isinstance(native.value, (AssertionError, RuntimeError))


@pytest.mark.parametrize("tool", ["script", "fx", "export", "compile"])
@pytest.mark.parametrize("make", [lambda: cvops.torchvision.PSRoIPool((2, 3), 0.5),
                                  lambda: cvops.nn.PSRoIPool(3, 0.5, 3, 2)], ids=["torchvision", "nn"])
def test_modules_under_graph_tools(tool, make):
    module = make()
    x = torch.randn(2, 18, 9, 13)
    rois = ROIS[:4]
    expected = module(x, rois)
    if tool == "script":
        graph = torch.jit.script(module)
    elif tool == "fx":
        graph = torch.fx.symbolic_trace(module)
    elif tool == "export":
        graph = torch.export.export(module, (x, rois)).module()
    else:
        graph = torch.compile(module, backend="aot_eager", fullgraph=True)
    assert torch.equal(graph(x, rois), expected)
    if tool == "compile":  # autograd through the compiled graph
        t = x.clone().requires_grad_()
        graph(t, rois).sum().backward()
        assert t.grad is not None and t.grad.abs().sum() > 0
