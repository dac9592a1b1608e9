import os

import torch

# Triton kernels run on the GPU when there is one, else under the interpreter on CPU tensors.
# Set before any cvops triton module is imported (triton reads it when kernels are defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The environment's CVOPS_NUMBA changes only the CPU default (None / "cpu"); the tests name the backends
# "torch" and "numba" directly, and switch the default with `default_to` where a call takes no backend.
os.environ.setdefault("CVOPS_NUMBA", "1")

import pytest  # noqa: E402

from cvops._core.dispatch import triton_available  # noqa: E402
from cvops._core.jit import numba_available  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

requires_triton = pytest.mark.skipif(not triton_available(), reason="triton not installed")
requires_numba = pytest.mark.skipif(not numba_available(), reason="numba not installed (the numba extra)")

# The two CPU backends: "torch" (plain torch) and "numba" (the compiled loops, when numba is installed).
CPU_PATHS = ["torch", pytest.param("numba", marks=requires_numba)]
FAST_BACKENDS = CPU_PATHS + [pytest.param("triton", marks=requires_triton)]


def installed_cpu_paths() -> list[str]:
    """The CPU backends this machine can run (for tests that loop over them around one slow reference)."""
    return ["torch"] + (["numba"] if numba_available() else [])


def default_to(backend: str, monkeypatch) -> None:
    """Makes ``backend`` ("torch" or "numba") the CPU default for the rest of the test, through
    ``CVOPS_NUMBA``: for calls that take no backend (layers, drop-in namespaces)."""
    monkeypatch.setenv("CVOPS_NUMBA", "1" if backend == "numba" else "0")


@pytest.fixture(params=CPU_PATHS)
def cpu_path(request, monkeypatch):
    """Runs a test once per CPU backend, made the default (for tests calling the default on CPU tensors)."""
    default_to(request.param, monkeypatch)
    return request.param
