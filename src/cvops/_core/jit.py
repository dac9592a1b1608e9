"""numba kernels for the CPU: the ``numba`` backend (``cpu_numba.py`` of an op; see ``_core/dispatch.py``).

The project rule: CPU backends are plain torch, and numba is allowed only where a benchmark shows torch
cannot reach the goal. Such an op keeps its torch backend and adds a module of fused loop kernels, which
the dispatcher makes the CPU default when

* numba imports, and
* the environment does not say ``CVOPS_NUMBA=0`` (read on every call, so tests and users can switch;
  an explicit ``backend="numba"`` ignores it).

Nothing here imports numba at ``import cvops`` time: the dispatcher imports an op's kernel module (which decorates
with :func:`njit`) when it first chooses the numba backend. Kernels compile on the calling thread
the first time they meet an argument type (dtype, array layout), with numba's public ``cache=True``: the
machine code is written to numba's disk cache and later processes load it. So which path computes a
result never depends on timing, and a result is the same on the first call and the thousandth. The
first call of a process pays numba's import and the loading of its kernels; on an empty cache it also
pays their compilation, which ``python -m cvops.precompile`` does ahead of time (images, CI).

Pure-IO kernels compile without fastmath (results match the loop references bit for bit); accumulating
kernels may allow reassociation and contraction (:data:`REASSOCIATE`) so LLVM vectorises their sums: the
order is fixed at compile time, so results are still the same on every run, and no-NaN/no-inf assumptions
are never made.

Where the cache lives: numba's own rule, which suits a pip install. It writes next to the kernel's
source (``__pycache__``) when that folder is writable, otherwise in the user's cache folder
(``~/.cache/numba`` on Linux), and ``NUMBA_CACHE_DIR`` moves it anywhere. Each kernel compiles once
per argument types, never per value: sizes, strides and flags are plain integer arguments.

Parallel kernels (``prange``) use numba's thread pool; :func:`match_torch_threads` gives it torch's
thread count first, so ``OMP_NUM_THREADS`` / ``torch.set_num_threads`` bound both paths alike, and
:func:`njit_variants` / :func:`use_parallel` keep small calls off the pool.
"""
from __future__ import annotations

import os
import types
from functools import lru_cache
from typing import Callable, Optional

ENV_SWITCH = "CVOPS_NUMBA"
_OFF = ("0", "false", "False", "no", "off")
# fastmath flags for accumulating kernels: sums may be reordered (vectorised) and a*b+c fused; NaN and inf
# keep their IEEE meaning
REASSOCIATE = frozenset({"reassoc", "contract"})
# every (serial, parallel) pair of njit_variants, so cvops.precompile can compile each for the other's types
VARIANTS: list[tuple] = []


@lru_cache(maxsize=None)
def numba_available() -> bool:
    """numba imports (checked once)."""
    try:
        import numba  # noqa: F401
    except Exception:  # ImportError, or a numba/numpy version mismatch raising at import
        return False
    return True


def numba_enabled() -> bool:
    """numba imports and ``CVOPS_NUMBA`` does not switch it off (``0``, ``false``, ``no``, ``off``; read on
    every call)."""
    return os.environ.get(ENV_SWITCH, "").strip() not in _OFF and numba_available()


def njit(fn: Optional[Callable] = None, *, parallel: bool = False, error_model: str = "python",
         fastmath=False):
    """``numba.njit(cache=True, nogil=True, parallel=parallel, fastmath=fastmath)`` as a decorator, with or
    without arguments. Imports numba, so use it only in kernel modules (the ops' ``cpu_numba``, which the
    dispatcher imports when it chooses numba).
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
    VARIANTS.append(tuple(variants))
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
