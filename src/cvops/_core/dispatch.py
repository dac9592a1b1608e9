"""Backend dispatch: ``reference`` (literal loops), ``cpu`` (vectorised torch) and ``triton``.

``backend=None`` picks ``triton`` for CUDA tensors and ``cpu`` otherwise. Any backend may be forced:
tests run ``"triton"`` on CPU tensors under ``TRITON_INTERPRET=1``. The triton modules are imported
only when chosen, so cvops imports and runs with torch alone.

Availability is looked up with ``importlib.util.find_spec`` (no import): importing triton costs about a
second, which a process whose ops run on the CPU should not pay.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from functools import lru_cache
from types import ModuleType

import torch

from .errors import NotSupportedError
from .validate import require

BACKENDS = ("reference", "cpu", "triton")


@lru_cache(maxsize=None)
def triton_available() -> bool:
    """triton is installed (found on the path; not imported until a triton backend is chosen)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(op: str, backend: str | None, device: torch.device) -> str:
    if backend is None:
        return "triton" if device.type == "cuda" and triton_available() else "cpu"
    require(backend in BACKENDS, op, f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if backend == "triton":
        if not triton_available():
            raise NotSupportedError(op, "backend 'triton' needs the triton package (pip install cvops[gpu])")
        if device.type != "cuda" and not triton_interpreted():
            raise NotSupportedError(
                op, f"backend 'triton' runs CUDA tensors, got {device.type} (set TRITON_INTERPRET=1 to interpret)")
    return backend


def check_backend(op: str, backend: str | None, device: torch.device) -> None:
    """Every public function calls this before any work: an unknown backend name raises BadParamError, and
    ``"triton"`` where it cannot run (no triton, or a CPU tensor without ``TRITON_INTERPRET=1``) raises
    NotSupportedError. ``None`` runs anywhere."""
    if backend is not None:
        resolve_backend(op, backend, device)


def backend_module(package: str, op: str, backend: str | None, device: torch.device) -> ModuleType:
    """The module ``<package>.<backend>`` for ``op``; every backend module exposes the same functions."""
    return importlib.import_module(f"{package}.{resolve_backend(op, backend, device)}")
