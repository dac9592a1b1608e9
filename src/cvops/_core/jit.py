"""numba kernels for the CPU: the ``numba`` backend (an op's ``cpu_numba.py``; see ``_core/dispatch.py``), which
the dispatcher makes the CPU default when numba imports and ``CVOPS_NUMBA`` is not ``0`` (read on every call;
an explicit ``backend="numba"`` ignores it). Nothing here imports numba at ``import cvops`` time.

Kernels compile on the calling thread the first time they meet an argument type, with numba's ``cache=True``
(its disk cache; ``python -m cvops.precompile`` fills it ahead of time), so a result never depends on timing.
Pure-IO kernels compile without fastmath (bit-exact); accumulating ones may reassociate and contract
(:data:`REASSOCIATE`), in an order fixed at compile time. Kernels are serial loops over a range: their
parallelism is ``_core.parallel.run_parts``. docs/ARCHITECTURE.md (numba, first calls) says why.
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
