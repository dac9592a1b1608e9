import contextlib
import os

import torch

# Triton kernels run on the GPU when there is one, else under the interpreter on CPU tensors.
# Set before any cvops triton module is imported (triton reads it when kernels are defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The numba kernels on (the default too, unless the caller's environment says CVOPS_NUMBA=0); tests that
# need the torch path select it with `selected` / `select` below.
os.environ.setdefault("CVOPS_NUMBA", "1")

import pytest  # noqa: E402

from cvops._core.dispatch import triton_available  # noqa: E402
from cvops._core.jit import numba_available  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

requires_triton = pytest.mark.skipif(not triton_available(), reason="triton not installed")
requires_numba = pytest.mark.skipif(not numba_available(), reason="numba not installed (the numba extra)")

# A cpu backend with a numba fast path is tested on both of its paths: "cpu-torch" (CVOPS_NUMBA=0, the
# vectorised fallback) and "cpu-numba" (the compiled loops, when numba is installed).
CPU_PATHS = ["cpu-torch", pytest.param("cpu-numba", marks=requires_numba)]
FAST_BACKENDS = CPU_PATHS + [pytest.param("triton", marks=requires_triton)]


def installed_cpu_paths() -> list[str]:
    """The cpu paths this machine can run (for tests that loop over them around one slow reference)."""
    return ["cpu-torch"] + (["cpu-numba"] if numba_available() else [])


@contextlib.contextmanager
def selected(backend: str):
    """Yields the backend name to pass to an op: ``cpu-torch`` / ``cpu-numba`` give ``cpu`` with
    ``CVOPS_NUMBA`` set for the duration (works inside hypothesis tests, unlike monkeypatch)."""
    if not backend.startswith("cpu-"):
        yield backend
        return
    previous = os.environ.get("CVOPS_NUMBA")
    os.environ["CVOPS_NUMBA"] = "1" if backend == "cpu-numba" else "0"
    try:
        yield "cpu"
    finally:
        if previous is None:
            del os.environ["CVOPS_NUMBA"]
        else:
            os.environ["CVOPS_NUMBA"] = previous


def select(backend: str, monkeypatch) -> str:
    """The backend name to pass to an op, ``CVOPS_NUMBA`` set for the rest of the test."""
    if backend.startswith("cpu-"):
        monkeypatch.setenv("CVOPS_NUMBA", "1" if backend == "cpu-numba" else "0")
        return "cpu"
    return backend


@pytest.fixture(params=CPU_PATHS)
def cpu_path(request, monkeypatch):
    """Runs a test once per cpu path (for tests calling the default backend on CPU tensors)."""
    select(request.param, monkeypatch)
    return request.param
