"""Backend dispatch: ``reference`` (literal loops), ``cpu`` (vectorised torch) and ``triton``.

``backend=None`` picks ``triton`` for CUDA tensors and ``cpu`` otherwise. Any backend may be forced:
tests run ``"triton"`` on CPU tensors under ``TRITON_INTERPRET=1``. The triton modules are imported
only when chosen, so cvops imports and runs with torch alone.

Availability is looked up with ``importlib.util.find_spec`` (no import): importing triton, or torch's
compiler stack, costs about a second, which the first op call of a process should not pay when it
runs on the CPU. :func:`defer_dynamo_import` keeps ``torch.library.custom_op`` from importing
``torch._dynamo`` (and with it triton) on the first call of each op.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
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


def _dynamo_disabled_when_loaded(plain):
    """``plain`` wrapped in ``torch._dynamo.disable`` once ``torch._dynamo`` is loaded, and called as is
    before: code that dynamo could trace only runs after ``torch._dynamo`` has been imported."""
    disabled = None

    def call(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            if "torch._dynamo" not in sys.modules:
                return plain(*args, **kwargs)
            import torch._dynamo
            disabled = torch._dynamo.disable(plain, recursive=True, wrapping=False)
        return disabled(*args, **kwargs)

    return call


def defer_dynamo_import(namespace: str = "cvops") -> None:
    """Make the custom ops of ``namespace`` import ``torch._dynamo`` only when it is in use.

    ``torch.library.custom_op`` wraps each kernel in ``torch._disable_dynamo``, which imports
    ``torch._dynamo`` (sympy, triton: about a second) on the kernel's first call, only to build a
    wrapper that keeps dynamo from tracing the kernel. That wrapper looks for a prebuilt one on the
    kernel first; this supplies one that builds the real wrapper once ``torch._dynamo`` is loaded
    (``torch.compile`` loads it before it traces anything) and calls the kernel directly until then.
    Does nothing where torch's internals differ from this layout.
    """
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return
    for name, opdef in list(OPDEFS.items()):
        if not name.startswith(namespace + "::"):
            continue
        for wrapper in getattr(opdef, "_backend_fns", {}).values():
            plain = getattr(wrapper, "__wrapped__", None)
            if plain is not None and getattr(plain, "__dynamo_disable", None) is None:
                plain.__dynamo_disable = _dynamo_disabled_when_loaded(plain)


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
