"""Output allocation for the CPU backends: every output is a fresh torch tensor (no buffer is recycled: whether
one is free cannot be known through public APIs), and large ones get ``madvise(MADV_HUGEPAGE)`` on their 2 MiB-
aligned interior, since faulting in fresh 4 KiB pages is a large part of the pure-IO ops' cost (advice only).
"""
from __future__ import annotations

import ctypes
import ctypes.util

import torch

_HUGE = 1 << 21  # below this the page-fault cost does not matter; also the huge-page size
_MADV_HUGEPAGE = 14


def _load_libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()
_MADVISE = getattr(_LIBC, "madvise", None)
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)  # glibc only
if _MADVISE is not None:
    _MADVISE.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
if _MALLOC_TRIM is not None:
    _MALLOC_TRIM.argtypes = (ctypes.c_size_t,)


def _advise_huge_pages(buf: torch.Tensor, nbytes: int) -> None:
    """Ask for huge pages on the 2 MiB-aligned interior of a new buffer (advice only: failure is harmless)."""
    if _MADVISE is None or nbytes < 2 * _HUGE:
        return
    start = -buf.data_ptr() % _HUGE
    length = (nbytes - start) // _HUGE * _HUGE
    if length:
        _MADVISE(buf.data_ptr() + start, length, _MADV_HUGEPAGE)


def empty_cache() -> int:
    """Hands free heap memory back to the system (``malloc_trim(0)`` on glibc) and returns 0, the bytes of
    cvops's own cache released: it holds none."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    return 0


# The scratch of a loop over blocks of rows: a few MiB stay in a server core's L2/L3 from the write to the
# read, and a heap block of that size is reused from call to call (a whole tens-of-MiB intermediate is
# fresh pages, zeroed by the kernel, on every call).
BLOCK_BYTES = 4 << 20


def block_rows(row_bytes: int) -> int:
    """Rows of ``row_bytes`` each in one block of at most :data:`BLOCK_BYTES` (at least one)."""
    return max(1, BLOCK_BYTES // max(row_bytes, 1))


def new_empty(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.empty(shape, dtype, device)``; a large CPU tensor also gets the huge-page advice."""
    device = torch.device(device)
    out = torch.empty(tuple(int(s) for s in shape), dtype=dtype, device=device)
    if device.type == "cpu":
        _advise_huge_pages(out, out.numel() * out.element_size())
    return out


def new_zeros(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    return new_empty(shape, dtype, device).zero_()
