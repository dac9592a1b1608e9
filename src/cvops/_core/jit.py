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

Kernels are serial loops over a range handed to them; their parallelism is cvops's one pool of Python
threads (``_core.parallel.run_parts``, torch's thread count), since the kernels release the GIL, and
:func:`use_parallel` keeps small calls on the calling thread.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Callable, Optional

ENV_SWITCH = "CVOPS_NUMBA"
_OFF = ("0", "false", "False", "no", "off")
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


def numba_enabled() -> bool:
    """numba imports and ``CVOPS_NUMBA`` does not switch it off (``0``, ``false``, ``no``, ``off``; read on
    every call)."""
    return os.environ.get(ENV_SWITCH, "").strip() not in _OFF and numba_available()


def njit(fn: Optional[Callable] = None, *, error_model: str = "python", fastmath=False):
    """``numba.njit(cache=True, nogil=True, fastmath=fastmath)`` as a decorator, with or
    without arguments. Imports numba, so use it only in kernel modules (the ops' ``cpu_numba``, which the
    dispatcher imports when it chooses numba).
    ``fastmath`` is False (exact) or :data:`REASSOCIATE` (accumulating kernels only).

    ``error_model="numpy"``: divisions follow IEEE (x/0 gives inf/NaN) instead of raising
    ZeroDivisionError; without the per-division check, loops with divisions can be vectorised."""
    import numba

    def wrap(f):
        flags = set(fastmath) if fastmath else False
        return numba.njit(cache=True, nogil=True, fastmath=flags, error_model=error_model)(f)

    return wrap(fn) if fn is not None else wrap


def inline(fn: Callable) -> Callable:
    """A helper of a kernel module's kernels, inlined into each caller's numba IR (never compiled on its own;
    it takes the caller's fastmath flags)."""
    import numba
    return numba.njit(inline="always")(fn)


def use_parallel(work: float, threshold: float = 4e6) -> bool:
    """Whether a call doing about ``work`` elementary steps should go to the thread pool
    (``_core.parallel.run_parts``): torch uses more than one thread and the work amounts to milliseconds
    (below that waking the pool costs as much)."""
    import torch

    return work >= threshold and torch.get_num_threads() > 1
