"""Output allocation for the CPU backends.

Fresh memory is the dominant cost of the pure-IO operators on the CPU. A new 90 MB torch tensor is
backed by 4 KiB pages that the kernel faults in and zeroes on first touch: filling it takes ~20 ms on
the 2-core CI machine, where refilling a buffer that is already mapped takes 2.5 ms. Two remedies:

- NumPy asks the kernel for transparent huge pages on large buffers (``madvise``), which halves the
  first-touch cost.
- The buffers behind large outputs are *recycled*, as PyTorch's CUDA caching allocator does on the
  GPU: cvops keeps a reference to each buffer it hands out, and once every tensor viewing it is gone
  (only cvops' reference is left), the next request of the same size reuses it instead of mapping
  fresh pages. In a training loop the step-``k`` outputs are freed before step ``k+1`` asks again, so
  the steady state maps nothing new.

The pool holds at most ``CVOPS_RECYCLE_MB`` MiB (default 1024) of buffers; ``CVOPS_RECYCLE=0`` turns
recycling off and :func:`empty_cache` drops the idle buffers. ``benchmarks/`` measures the difference.
"""
from __future__ import annotations

import os
import threading
import weakref

import numpy as np
import torch

_NUMPY_OF = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
             torch.bfloat16: np.int16, torch.int16: np.int16, torch.int32: np.int32,
             torch.int64: np.int64, torch.uint8: np.uint8, torch.int8: np.int8, torch.bool: np.bool_}
_HUGE = 1 << 21  # below this the page-fault cost does not matter


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class _Recycler:
    """Byte buffers (uint8 ndarrays) for large outputs, reused once no tensor views them any more.

    Each buffer is handed out as a fresh ndarray view of it; the tensor made by ``from_numpy`` (and
    every view of that tensor, which shares its storage) keeps that view alive, so a dead weak
    reference to it means nothing uses the buffer.
    """

    def __init__(self):
        self._pool: list[list] = []  # [buffer, weakref to its current view or None], oldest first
        self._lock = threading.Lock()

    @staticmethod
    def _idle(entry) -> bool:
        return entry[1] is None or entry[1]() is None

    def take(self, nbytes: int) -> np.ndarray:
        limit = _env_int("CVOPS_RECYCLE_MB", 1024) << 20
        with self._lock:
            entry = next((e for e in self._pool if e[0].nbytes == nbytes and self._idle(e)), None)
            if entry is None:
                # Make room by dropping idle buffers, oldest first.
                held = sum(e[0].nbytes for e in self._pool)
                keep = []
                for e in self._pool:
                    if held + nbytes > limit and self._idle(e):
                        held -= e[0].nbytes
                    else:
                        keep.append(e)
                self._pool = keep
                entry = [np.empty(nbytes, np.uint8), None]
                if held + nbytes <= limit:
                    self._pool.append(entry)
            handout = entry[0].view()
            entry[1] = weakref.ref(handout)
            return handout

    def release_idle(self) -> int:
        """Forget the idle buffers (their memory goes back to the system); returns the bytes freed."""
        with self._lock:
            freed = sum(e[0].nbytes for e in self._pool if self._idle(e))
            self._pool = [e for e in self._pool if not self._idle(e)]
            return freed

    def held_bytes(self) -> int:
        with self._lock:
            return sum(e[0].nbytes for e in self._pool)


_RECYCLER = _Recycler()


def empty_cache() -> int:
    """Release the idle output buffers cvops keeps for reuse; returns the number of bytes released."""
    return _RECYCLER.release_idle()


def new_empty(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.empty`` that reuses (or huge-page maps) the memory of large CPU tensors."""
    device = torch.device(device)
    numel = 1
    for s in shape:
        numel *= int(s)
    itemsize = dtype.itemsize
    nbytes = numel * itemsize
    if device.type != "cpu" or dtype not in _NUMPY_OF or nbytes < _HUGE:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    if os.environ.get("CVOPS_RECYCLE", "1") == "0":
        array = np.empty(nbytes, np.uint8)
    else:
        array = _RECYCLER.take(nbytes)
    return torch.from_numpy(array).view(dtype).view(tuple(int(s) for s in shape))


def new_zeros(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    return new_empty(shape, dtype, device).zero_()
