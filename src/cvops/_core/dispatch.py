"""Backend dispatch: which module of an op's package runs a call.

``"reference"`` -> ``reference.py`` (literal loops, the oracle); ``"torch"`` -> ``cpu.py`` (plain torch, any
device); ``"numba"`` -> ``cpu_numba.py`` (compiled loops on CPU tensors); ``"triton"`` -> ``triton.py`` (CUDA
tensors, or CPU ones under ``TRITON_INTERPRET=1``). ``None`` is the device's default and ``"cpu"`` an alias of
the CPU default; ``CVOPS_NUMBA=0`` changes only the default. Modules are imported only when chosen, and triton
is only looked for (importing it costs about a second, which CPU-only processes should not pay).
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
    if backend is None or backend == CPU_ALIAS:  # first: this runs on every call
        if device.type == "cuda" and backend is None and triton_available():
            return "triton"
        return "numba" if numba_enabled() and _numba_refusal(package, device, tensors) is None else "torch"
    require(backend in BACKENDS, op, f"backend must be one of {BACKENDS}, {CPU_ALIAS!r} or None, got {backend!r}")
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
    """Every public function calls this before any work: an unknown backend name raises BadParamError, an
    explicit backend that cannot run the call NotSupportedError naming why. ``None`` and ``"cpu"`` run anywhere."""
    if backend is not None and backend != CPU_ALIAS:
        resolve_backend(package, op, backend, device, *tensors)


def backend_module(package: str, op: str, backend: str | None, device: torch.device, *tensors) -> ModuleType:
    """The module of :func:`resolve_backend`'s choice; every backend module of an op exposes the same
    functions."""
    return importlib.import_module(f"{package}.{MODULES[resolve_backend(package, op, backend, device, *tensors)]}")
