"""The GPU paths of the fixed-shape ops never read a tensor back to the host.

Without a GPU, the CUDA path's Python code runs on CPU tensors with the triton backend under the
interpreter, with ``_core.sync.host_checks`` answering as for a CUDA tensor, and every way Python code
can read a tensor's values (``item``, ``tolist``, ``cpu``, ``numpy``, ``bool`` / ``int`` / ``float`` /
``index`` conversions, ``nonzero``, ``unique``, ``masked_select``) patched to raise. The interpreter's
own kernel execution is exempt: on a GPU it is an asynchronous launch.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import cvops
from cvops._core import sync
from cvops._core.dispatch import triton_interpreted
from tests.conftest import requires_triton

pytestmark = [requires_triton, pytest.mark.skipif(not triton_interpreted(), reason="CPU tensors on the triton "
                                                   "backend need TRITON_INTERPRET=1 (a GPU run checks real CUDA)")]

_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero",
            "unique", "masked_select")
_FUNCTIONS = ("nonzero", "unique", "masked_select")


class HostSync(AssertionError):
    pass


@contextlib.contextmanager
def no_host_syncs():
    """Raises :class:`HostSync` on any value read outside kernel launches; CUDA-path checks selected."""
    from triton.runtime.interpreter import InterpretedFunction
    state = {"in_kernel": False}
    launch = InterpretedFunction.run

    def run(self, *args, **kwargs):
        state["in_kernel"] = True
        try:
            return launch(self, *args, **kwargs)
        finally:
            state["in_kernel"] = False

    def guarded(name, original):
        def read(*args, **kwargs):
            if not state["in_kernel"]:
                raise HostSync(f"{name} reads a tensor on the host")
            return original(*args, **kwargs)
        return read

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(InterpretedFunction, "run", run)
        mp.setattr(sync, "host_checks", lambda t: False)
        for owner, names in ((torch.Tensor, _METHODS), (torch, _FUNCTIONS)):
            for name in names:
                mp.setattr(owner, name, guarded(name, getattr(owner, name)))
        yield


def test_the_guard_catches_reads():
    x = torch.ones(3)
    with no_host_syncs():
        for read in (lambda: x.sum().item(), lambda: bool(x.any()), lambda: x.tolist(), lambda: int(x[0]),
                     lambda: torch.nonzero(x), lambda: x.cpu(), lambda: x.nonzero()):
            with pytest.raises(HostSync):
                read()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(1, 9, 4, 5, generator=g), "grad": torch.randn(1, 20, 4, 5, generator=g),
        "feat": torch.randn(1, 4, 3, 4, generator=g), "masks": torch.randn(1, 9, 6, 8, generator=g),
        "gy": torch.randn(1, 4, 6, 8, generator=g), "image": torch.randn(1, 3, 5, 6, generator=g),
        "col": torch.randn(3, 7, generator=g), "h": torch.tensor([0, 1, 1, 4, 2, 9, 1]),
        "w": torch.tensor([0, 2, 2, 5, -1, 0, 3]), "p": torch.randn(2, 8, 6, 7, generator=g),
        "rois": torch.tensor([[0, 0.0, 1.0, 5.0, 4.0], [1, 2.0, 0.0, 6.0, 5.0]]),
        "top": torch.randn(2, 2, 2, 2, generator=g),
    }


def _calls(t):
    """Every fixed-shape entry point of psamask, carafe, masked_im2col and psroipool on the triton backend."""
    b = "triton"
    mapping = cvops.psroi_pool(t["p"], t["rois"], 2, 2, 1.0, 2, 2, backend=b)[1]
    return {
        "psamask_forward": lambda: cvops.psamask_forward(t["x"], "collect", 3, backend=b),
        "psamask_backward": lambda: cvops.psamask_backward(t["grad"], "distribute", 3, backend=b),
        "psamask_nhwc": lambda: cvops.psamask_forward(t["x"].permute(0, 2, 3, 1), "collect", 3, "NHWC", backend=b),
        "carafe_forward": lambda: cvops.carafe_forward(t["feat"], t["masks"], 3, 1, 2, backend=b),
        "carafe_backward": lambda: cvops.carafe_backward(t["gy"], t["feat"], t["masks"], 3, 1, 2, backend=b),
        "masked_im2col": lambda: cvops.masked_im2col(t["image"], t["h"], t["w"], 3, 1, backend=b),
        "masked_col2im": lambda: cvops.masked_col2im(t["col"], t["h"], t["w"], 5, 6, backend=b),
        "psroi_pool": lambda: cvops.psroi_pool(t["p"], t["rois"], 2, 2, 1.0, 2, 2, backend=b),
        "psroi_pool_backward": lambda: cvops.psroi_pool_backward(t["top"], t["rois"], mapping, 1.0, 2, (2, 8, 6, 7),
                                                                 backend=b),
    }


NAMES = ("psamask_forward", "psamask_backward", "psamask_nhwc", "carafe_forward", "carafe_backward", "masked_im2col",
         "masked_col2im", "psroi_pool", "psroi_pool_backward")


@pytest.mark.parametrize("name", NAMES)
def test_gpu_path_reads_nothing_back(name):
    calls = _calls(_inputs())
    assert set(calls) == set(NAMES)
    call = calls[name]
    expected = call()                     # the same call with host reads allowed
    with no_host_syncs():
        result = call()
    for a, e in zip(*(r if isinstance(r, tuple) else (r,) for r in (result, expected))):
        assert torch.equal(a, e)


def test_value_checks_stay_on_the_device():
    """A bad batch index still fails on the CUDA path: as a device-side bounds assertion (on a GPU it fires at
    the next synchronisation; here, on a CPU tensor, at once as the CPU's index error)."""
    t = _inputs()
    rois = t["rois"].clone()
    with no_host_syncs():  # good values: the queued check passes
        cvops.psroi_pool(t["p"], rois, 2, 2, 1.0, 2, 2, backend="triton")
    rois[1, 0] = 5
    with no_host_syncs():
        with pytest.raises(IndexError, match="out of range"):
            cvops.psroi_pool(t["p"], rois, 2, 2, 1.0, 2, 2, backend="triton")
    rois[1, 0], rois[0, 2] = 1, float("nan")  # a corner that is not finite
    with no_host_syncs():
        with pytest.raises(IndexError, match="out of range"):
            cvops.psroi_pool(t["p"], rois, 2, 2, 1.0, 2, 2, backend="triton")
    rois[0, 2] = 1.0
    rois[1, 0] = 5
    with pytest.raises(cvops.BadParamError, match=r"rois\[1, 0\]"):   # on the host: the detailed error
        cvops.psroi_pool(t["p"], rois, 2, 2, 1.0, 2, 2, backend="triton")
