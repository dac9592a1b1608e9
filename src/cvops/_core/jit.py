"""Optional numba kernels for CPU backends (the ``numba`` extra; torch stays the fallback).

The project rule: CPU backends are vectorised torch, and numba is allowed only where a benchmark shows
torch cannot reach the goal. Such an op keeps its torch path and adds a fused loop kernel that is used when

* numba imports (``pip install cvops[numba]``), and
* the environment does not say ``CVOPS_NUMBA=0`` (read on every call, so tests and users can switch).

Nothing here imports numba at ``import cvops`` time: an op imports its kernel module (which decorates with
:func:`njit`) only after :func:`numba_mode` said it may. By default (:func:`numba_mode` "background") the
ops' kernel modules are imported, and their kernels compiled per signature, by a worker thread
(:mod:`.jit_background`) while the calls that find them not ready run the torch path; ``CVOPS_NUMBA=1``
makes each call compile what it needs on its own thread. Kernels are cached on disk (``cache=True``)
and release the GIL. Pure-IO kernels compile without fastmath (results
match the loop references bit for bit); accumulating kernels may allow reassociation and contraction
(:data:`REASSOCIATE`) so LLVM vectorises their sums: the order is fixed at compile time, so results are
still the same on every run, and no-NaN/no-inf assumptions are never made.

Where the cache lives: numba's own rule, which suits a pip install. It writes next to the kernel's
source (``__pycache__``) when that folder is writable, otherwise in the user's cache folder
(``~/.cache/numba`` on Linux), and ``NUMBA_CACHE_DIR`` moves it anywhere. Each kernel compiles once
per argument types (dtype, array layout), never per value: sizes, strides and flags are plain
integer arguments. Importing numba and loading cached kernels is a fixed cost in each process, and
compiling the kernels an op needs a larger one once per machine: the worker keeps both off the calling
thread.

Parallel kernels (``prange``) use numba's thread pool; :func:`match_torch_threads` gives it torch's
thread count first, so ``OMP_NUM_THREADS`` / ``torch.set_num_threads`` bound both paths alike, and
:func:`njit_variants` / :func:`use_parallel` keep small calls off the pool.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import types
from functools import lru_cache
from typing import Callable, Optional

from . import jit_background as _jit_background
from .jit_background import KernelNotReady  # noqa: F401  (re-exported for the ops' fallbacks)

ENV_SWITCH = "CVOPS_NUMBA"
# fastmath flags for accumulating kernels: sums may be reordered (vectorised) and a*b+c fused; NaN and inf
# keep their IEEE meaning
REASSOCIATE = frozenset({"reassoc", "contract"})


@lru_cache(maxsize=None)
def numba_available() -> bool:
    """numba imports (checked once)."""
    try:
        import numba  # noqa: F401
    except Exception:  # ImportError, or a numba/numpy version mismatch raising at import
        return False
    return True


def numba_mode() -> str:
    """How CPU ops use numba, from ``CVOPS_NUMBA`` (read on every call: tests flip it):

    * ``"background"`` (unset or ``auto``): kernels load and compile on a worker thread
      (:mod:`.jit_background`); until an op's kernels are ready its calls run the torch path;
    * ``"wait"`` (``1``, or any other value, and whenever ``torch.use_deterministic_algorithms(True)``
      is in force): a call loads or compiles the kernels it needs on the calling thread, so which path
      computed a result never depends on timing;
    * ``"off"`` (``0``, or numba not installed, or in a process forked while the background worker was
      importing or compiling, see :func:`.jit_background.lost_at_fork`): the torch path only.
    """
    import torch

    if _jit_background.lost_at_fork():
        return "off"
    return _mode_of(os.environ.get(ENV_SWITCH), torch.are_deterministic_algorithms_enabled())


@lru_cache(maxsize=16)
def _mode_of(switch: Optional[str], deterministic: bool) -> str:
    value = (switch or "auto").strip()
    if value in ("0", "false", "False", "no", "off"):
        return "off"
    if value == "auto" and not deterministic:
        return "background" if importlib.util.find_spec("numba") is not None else "off"  # no import here
    return "wait" if numba_available() else "off"


def numba_enabled() -> bool:
    """numba imports and is not switched off with ``CVOPS_NUMBA=0`` (for callers that import their kernel
    module on their own thread: this imports numba)."""
    return numba_mode() != "off" and numba_available()


def numba_kernels(package: str, *tensors, background: bool = False):
    """The op's compiled loops (``<package>.cpu_numba``) when numba is enabled and they take these
    tensors (``cpu_numba.supports``; no tensors: the module itself); None selects the op's torch code.
    Every op decides here.

    ``background=True`` is for callers that fall back to torch on :class:`KernelNotReady`: in the
    background mode they get None until the worker has imported the module, and its kernels raise
    KernelNotReady until the worker has compiled them. Other callers import and compile on their thread."""
    mode = numba_mode()
    if mode == "off":
        return None
    if background and mode == "background":
        module = _jit_background.loaded(package)
        if module is None or module is _jit_background.UNAVAILABLE:
            return None
    else:
        module = _kernels_module(package)
        _jit_background.compile_on_call(module)
    return module if not tensors or module.supports(*tensors) else None


@lru_cache(maxsize=None)
def _kernels_module(package: str):
    return importlib.import_module(f"{package}.cpu_numba")  # imported on first use (it imports numba)


def njit(fn: Optional[Callable] = None, *, parallel: bool = False, error_model: str = "python",
         fastmath=False):
    """``numba.njit(cache=True, nogil=True, parallel=parallel, fastmath=fastmath)`` as a decorator, with or
    without arguments. Imports numba, so use it only in kernel modules (the ops' ``cpu_numba``, which
    :func:`numba_kernels` imports when numba is on).
    ``fastmath`` is False (exact) or :data:`REASSOCIATE` (accumulating kernels only).

    ``error_model="numpy"``: divisions follow IEEE (x/0 gives inf/NaN) instead of raising
    ZeroDivisionError; without the per-division check, loops with divisions can be vectorised."""
    import numba

    def wrap(f):
        flags = set(fastmath) if fastmath else False
        return numba.njit(cache=True, nogil=True, parallel=parallel, fastmath=flags, error_model=error_model)(f)

    return wrap(fn) if fn is not None else wrap


def inline(fn: Callable) -> Callable:
    """A helper of a kernel module's kernels, inlined into each caller's numba IR (never compiled on its own;
    it takes the caller's fastmath flags)."""
    import numba
    return numba.njit(inline="always")(fn)


def njit_variants(fn: Callable, *, error_model: str = "python", fastmath=False):
    """``(serial, parallel)`` compilations of one kernel written with ``prange``.

    Waking a thread pool costs from tens of microseconds (idle machine) to a scheduler tick or two (busy
    one), more than a small call's whole work, so callers pick the serial variant below a work threshold
    (see :func:`use_parallel`). Each variant gets its own ``__qualname__``: numba's on-disk cache is keyed by
    name and signature, not by the ``parallel`` flag, and would otherwise hand one variant the other's code.
    """
    variants = []
    for suffix, parallel in (("serial", False), ("parallel", True)):
        copy = types.FunctionType(fn.__code__, fn.__globals__, f"{fn.__name__}_{suffix}", fn.__defaults__,
                                  fn.__closure__)
        copy.__qualname__ = f"{fn.__qualname__}_{suffix}"
        copy.__doc__ = fn.__doc__
        variants.append(njit(copy, parallel=parallel, error_model=error_model, fastmath=fastmath))
    return tuple(variants)


def use_parallel(work: float, threshold: float = 4e6) -> bool:
    """Whether a call doing about ``work`` elementary steps should run on the thread pool: torch uses more
    than one thread and the work amounts to milliseconds (below that a pool wake-up costs as much)."""
    import torch

    return work >= threshold and torch.get_num_threads() > 1


def match_torch_threads() -> None:
    """Run numba's parallel loops on as many threads as torch uses (at most numba's pool size)."""
    import numba
    import torch

    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
