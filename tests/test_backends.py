"""Backend choice (``_core/dispatch.py``): explicit names, the device's default, the ``"cpu"`` alias and the
NotSupportedError of an explicit backend that cannot run a call. Which module ran is recorded by wrapping
psamask's ``forward`` in its torch (``cpu.py``) and numba (``cpu_numba.py``) modules."""
from __future__ import annotations

import pytest
import torch

import cvops
from cvops._core import dispatch, jit
from cvops._core.errors import BadParamError, NotSupportedError
from cvops.metrics import bit_equal
from tests.conftest import requires_numba

PACKAGE = "cvops.ops.psamask"


@pytest.fixture
def ran(monkeypatch):
    """The backends whose psamask forward ran, in call order."""
    from cvops.ops.psamask import cpu, cpu_numba
    calls = []
    for name, module in (("torch", cpu), ("numba", cpu_numba)):
        def recorded(*args, _name=name, _forward=module.forward):
            calls.append(_name)
            return _forward(*args)
        monkeypatch.setattr(module, "forward", recorded)
    return calls


def _psamask(dtype=torch.float32, backend=None):
    x = torch.randn(1, 9, 4, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = cvops.psamask(x, "collect", 3, backend=backend)
    assert bit_equal(out, cvops.psamask(x, "collect", 3, backend="reference"))


def _numba_takes_only_float32_and_float64(monkeypatch):
    from cvops.ops.psamask import cpu_numba
    monkeypatch.setattr(cpu_numba, "SUPPORTED", (torch.float32, torch.float64))


@requires_numba
def test_default_on_the_cpu_is_numba_where_it_takes_the_tensors_else_torch(ran, monkeypatch):
    monkeypatch.setenv("CVOPS_NUMBA", "1")
    _numba_takes_only_float32_and_float64(monkeypatch)
    _psamask(torch.float32)
    _psamask(torch.float16)
    assert ran == ["numba", "torch"]


def test_cvops_numba_0_makes_torch_the_default(ran, monkeypatch):
    monkeypatch.setenv("CVOPS_NUMBA", "0")
    _psamask()
    assert ran == ["torch"]
    assert dispatch.resolve_backend(PACKAGE, "psamask", None, torch.device("cpu")) == "torch"


@requires_numba
def test_cpu_is_an_alias_of_the_cpu_default(ran, monkeypatch):
    for switch in ("1", "0"):
        monkeypatch.setenv("CVOPS_NUMBA", switch)
        _psamask(backend="cpu")
    assert ran == ["numba", "torch"]


@requires_numba
def test_explicit_names_run_their_module_whatever_cvops_numba_says(ran, monkeypatch):
    for switch in ("0", "1"):
        monkeypatch.setenv("CVOPS_NUMBA", switch)
        _psamask(backend="numba")
        _psamask(backend="torch")
    assert ran == ["numba", "torch"] * 2


@requires_numba
def test_explicit_numba_on_a_dtype_its_loops_do_not_take_raises_before_any_work(ran, monkeypatch):
    _numba_takes_only_float32_and_float64(monkeypatch)
    with pytest.raises(NotSupportedError, match=r"psamask: backend 'numba' does not take these tensors \(float16\)"):
        _psamask(torch.float16, backend="numba")
    assert ran == []


def test_explicit_numba_without_numba_raises_naming_the_backend(ran, monkeypatch):
    monkeypatch.setattr(dispatch, "numba_available", lambda: False)
    monkeypatch.setattr(jit, "numba_available", lambda: False)
    with pytest.raises(NotSupportedError, match="psamask: backend 'numba' needs the numba package"):
        _psamask(backend="numba")
    _psamask()  # the default falls back to torch
    assert ran == ["torch"]


@requires_numba
def test_explicit_numba_off_the_cpu_raises_naming_the_device():
    with pytest.raises(NotSupportedError, match="backend 'numba' runs CPU tensors, got cuda"):
        dispatch.check_backend(PACKAGE, "psamask", "numba", torch.device("cuda"))
    # the default on a CUDA tensor never picks numba (torch code where triton is missing)
    choice = dispatch.resolve_backend(PACKAGE, "psamask", None, torch.device("cuda"))
    assert choice == ("triton" if dispatch.triton_available() else "torch")


@pytest.mark.parametrize("name", ["cpu-numba", "numba ", "Torch", 0])
def test_unknown_backend_names_raise_bad_param(name):
    with pytest.raises(BadParamError, match="backend must be one of"):
        _psamask(backend=name)


@requires_numba
def test_numba_backend_runs_every_direction_of_a_partly_compiled_op():
    # masked_im2col compiles its forward only; the numba module serves the other directions with the torch code
    feature = torch.randn(1, 3, 5, 6, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([0, 2, 4])
    assert torch.autograd.gradcheck(lambda f: cvops.masked_im2col(f, idx, idx, 3, 1, backend="numba"), (feature,))
    cols = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c: cvops.masked_col2im(c, idx, idx, 5, 6, backend="numba"), (cols,))
