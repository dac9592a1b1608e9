"""Output allocation for the CPU backends.

Fresh memory is the dominant cost of the pure-IO operators on the CPU. A new large torch tensor is
backed by 4 KiB pages that the kernel faults in and zeroes on first touch, which costs several times
more than refilling a buffer that is already mapped. Two remedies:

- Large buffers ask the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)`` on their
  2 MiB-aligned interior), which halves the first-touch cost.
- The buffers behind large outputs are *recycled*, as PyTorch's CUDA caching allocator does on the
  GPU: cvops keeps each buffer it hands out, and once no tensor uses its storage any more (only
  cvops' reference is left), the next request of the same size reuses it instead of mapping fresh
  pages. In a training loop the step-``k`` outputs are freed before step ``k+1`` asks again, so the
  steady state maps nothing new.

Buffers are ordinary torch tensors from torch's CPU allocator, and an output is a view of one, so
outputs behave like any torch tensor: ``resize_()`` and ``untyped_storage().resize_()`` work. A
buffer whose storage was resized or moved (``share_memory_()``) by its user is simply forgotten.
Whether a buffer is in use is read from its storage's reference count, which counts every tensor,
view and autograd saved tensor that holds it.

The pool holds at most ``CVOPS_RECYCLE_MB`` MiB (default 1024) of buffers; ``CVOPS_RECYCLE=0`` turns
recycling off. :func:`empty_cache` drops the idle buffers and returns free heap memory to the system
(``malloc_trim`` on glibc). ``benchmarks/`` measures the difference.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

import torch

_HUGE = 1 << 21  # below this the page-fault cost does not matter; also the huge-page size
_MADV_HUGEPAGE = 14


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


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
_use_count = getattr(torch._C, "_storage_Use_Count", None)  # recycling is off without it


def _fresh(nbytes: int) -> torch.Tensor:
    """A new uint8 buffer from torch's allocator, huge pages requested on its aligned interior."""
    buf = torch.empty(nbytes, dtype=torch.uint8)
    if _MADVISE is not None and nbytes >= 2 * _HUGE:
        start = -buf.data_ptr() % _HUGE
        length = (nbytes - start) // _HUGE * _HUGE
        if length:
            _MADVISE(buf.data_ptr() + start, length, _MADV_HUGEPAGE)  # advice only: failure is harmless
    return buf


class _Entry:
    __slots__ = ("buf", "nbytes", "ptr")

    def __init__(self, buf: torch.Tensor):
        self.buf, self.nbytes, self.ptr = buf, buf.numel(), buf.data_ptr()

    def intact(self) -> bool:
        """Still the memory cvops allocated (not resized or moved by a user of the storage)."""
        storage = self.buf.untyped_storage()
        return storage.nbytes() == self.nbytes and storage.data_ptr() == self.ptr

    def idle(self) -> bool:
        # the pool's tensor and the temporary storage object are the only references
        return _use_count(self.buf.untyped_storage()._cdata) <= 2


class _Recycler:
    """uint8 buffers for large outputs, reused once no tensor uses their storage any more."""

    def __init__(self):
        self._pool: list[_Entry] = []  # oldest first
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        limit = _env_int("CVOPS_RECYCLE_MB", 1024) << 20
        with self._lock:
            self._pool = [e for e in self._pool if e.intact()]
            entry = next((e for e in self._pool if e.nbytes == nbytes and e.idle()), None)
            if entry is None:
                # Make room by dropping idle buffers, oldest first.
                held = sum(e.nbytes for e in self._pool)
                keep = []
                for e in self._pool:
                    if held + nbytes > limit and e.idle():
                        held -= e.nbytes
                    else:
                        keep.append(e)
                self._pool = keep
                entry = _Entry(_fresh(nbytes))
                if held + nbytes <= limit:
                    self._pool.append(entry)
            return entry.buf.view(nbytes)  # a new tensor on the same storage

    def release_idle(self) -> int:
        """Forget the idle buffers (their memory goes back to torch's allocator); returns the bytes freed."""
        with self._lock:
            freed = sum(e.nbytes for e in self._pool if e.intact() and e.idle())
            self._pool = [e for e in self._pool if e.intact() and not e.idle()]
            return freed

    def held_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._pool if e.intact())


_RECYCLER = _Recycler()


def empty_cache() -> int:
    """Release the idle output buffers cvops keeps for reuse and hand free heap memory back to the
    system (``malloc_trim(0)`` on glibc, so the resident size really drops); returns the number of
    pooled bytes released."""
    freed = _RECYCLER.release_idle()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    return freed


def new_empty(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.empty`` that reuses (or huge-page maps) the memory of large CPU tensors."""
    device = torch.device(device)
    shape = tuple(int(s) for s in shape)
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * dtype.itemsize
    if device.type != "cpu" or nbytes < _HUGE or dtype.is_complex or dtype.itemsize > 8:
        return torch.empty(shape, dtype=dtype, device=device)
    if _use_count is None or os.environ.get("CVOPS_RECYCLE", "1") == "0":
        buf = _fresh(nbytes)
    else:
        buf = _RECYCLER.take(nbytes)
    return buf.view(dtype).view(shape)


def new_zeros(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    return new_empty(shape, dtype, device).zero_()
