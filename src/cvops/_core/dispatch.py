"""Backend dispatch: which module of an op's package runs a call.

Backend names and the module each one selects in ``cvops/ops/<op>/`` (and ``cvops/sparse/``):

* ``"reference"`` -> ``reference.py``: literal loops after the doc's pseudocode (the oracle);
* ``"torch"`` -> ``cpu.py``: plain torch, on any device;
* ``"numba"`` -> ``cpu_numba.py``: compiled loops on CPU tensors; where an op has no loop for a direction
  or a case, its ``cpu_numba`` runs the torch code for it;
* ``"triton"`` -> ``triton.py``: Triton kernels on CUDA tensors (tests run them on CPU tensors under
  ``TRITON_INTERPRET=1``).

``backend=None`` takes the device's default: triton on CUDA when installed; otherwise numba when it is
enabled (installed, and ``CVOPS_NUMBA`` does not switch it off) and its ``supports(*tensors)`` takes the
call's tensors; otherwise torch. ``"cpu"`` stays accepted as an alias of that CPU choice (numba when it
can, else torch), so code written for the earlier names keeps working. An explicit ``"numba"`` ignores
``CVOPS_NUMBA`` (which changes only the default) and raises NotSupportedError where it cannot run, as an
explicit ``"triton"`` does. :func:`resolve_backend` makes the whole choice, top to bottom.

Modules are imported only when chosen, so cvops imports and runs with torch alone. Availability is
looked up with ``importlib.util.find_spec`` for triton (no import: importing triton costs about a second,
which a process whose ops run on the CPU should not pay).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from functools import lru_cache
from types import ModuleType

import torch

from .errors import NotSupportedError
from .jit import numba_available, numba_enabled
from .validate import require

BACKENDS = ("reference", "torch", "numba", "triton")
CPU_ALIAS = "cpu"  # the CPU default under its earlier name
MODULES = {"reference": "reference", "torch": "cpu", "numba": "cpu_numba", "triton": "triton"}


@lru_cache(maxsize=None)
def triton_available() -> bool:
    """triton is installed (found on the path; not imported until a triton backend is chosen)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(package: str, op: str, backend: str | None, device: torch.device, *tensors) -> str:
    """The backend that runs a call of ``op`` (from ``package``) on ``device``. ``tensors``: what the numba
    loops' ``supports`` judges (none: the device alone)."""
    require(backend is None or backend == CPU_ALIAS or backend in BACKENDS, op,
            f"backend must be one of {BACKENDS}, {CPU_ALIAS!r} or None, got {backend!r}")
    if backend is None and device.type == "cuda" and triton_available():
        return "triton"
    if backend is None or backend == CPU_ALIAS:
        return "numba" if numba_enabled() and _numba_refusal(package, device, tensors) is None else "torch"
    refusal = {"numba": _numba_refusal, "triton": _triton_refusal}.get(backend)
    reason = refusal(package, device, tensors) if refusal else None
    if reason is not None:
        raise NotSupportedError(op, f"backend {backend!r} {reason}")
    return backend


def _numba_refusal(package: str, device: torch.device, tensors) -> str | None:
    """Why the numba loops cannot run this call, or None."""
    if not numba_available():
        return "needs the numba package (pip install numba)"
    if device.type != "cpu":
        return f"runs CPU tensors, got {device.type}"
    if tensors and not importlib.import_module(f"{package}.cpu_numba").supports(*tensors):
        dtypes = ", ".join(sorted({str(t.dtype).removeprefix("torch.") for t in tensors}))
        return f"does not take these tensors ({dtypes}); backend 'torch' does"
    return None


def _triton_refusal(package: str, device: torch.device, tensors) -> str | None:
    """Why the triton kernels cannot run this call, or None."""
    if not triton_available():
        return "needs the triton package (pip install cvops[gpu])"
    if device.type != "cuda" and not triton_interpreted():
        return f"runs CUDA tensors, got {device.type} (set TRITON_INTERPRET=1 to interpret)"
    return None


def check_backend(package: str, op: str, backend: str | None, device: torch.device, *tensors) -> None:
    """Every public function calls this before any work: an unknown backend name raises BadParamError, and
    an explicit backend that cannot run the call (``"triton"`` without triton or on a CPU tensor outside
    the interpreter, ``"numba"`` without numba, off the CPU or on tensors its loops do not take) raises
    NotSupportedError naming it. ``None`` and ``"cpu"`` run anywhere."""
    if backend is not None and backend != CPU_ALIAS:
        resolve_backend(package, op, backend, device, *tensors)


def backend_module(package: str, op: str, backend: str | None, device: torch.device, *tensors) -> ModuleType:
    """The module of :func:`resolve_backend`'s choice; every backend module of an op exposes the same
    functions."""
    return importlib.import_module(f"{package}.{MODULES[resolve_backend(package, op, backend, device, *tensors)]}")
