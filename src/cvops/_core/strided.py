"""Copies between arbitrary strided views of two tensors' storage, negative strides included.

Gather/scatter ops whose index math is affine (psamask's sliding window, im2col-like patterns) are a
single strided copy, but some of those views need negative strides, which torch cannot express.
NumPy can, and its copy loop picks a memory-friendly order; large copies are split over threads
(NumPy releases the GIL). Values move as raw bits, so any dtype is copied exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .bits import storage_bits
from .parallel import pool

_PARALLEL_BYTES = 1 << 20  # below this a thread hand-off costs more than it saves


@dataclass(frozen=True)
class View:
    """Sizes, strides (in elements, any sign) and offset (in elements from ``tensor.data_ptr()``)."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n


def _as_numpy(t: torch.Tensor, view: View) -> np.ndarray:
    if t.device.type != "cpu":
        raise ValueError("strided_copy works on CPU tensors")
    start = storage_bits(t)[t.storage_offset() + view.offset:]
    item = t.element_size()
    return np.lib.stride_tricks.as_strided(start, view.sizes, tuple(s * item for s in view.strides),
                                           writeable=True)


def strided_copy(dst: torch.Tensor, dst_view: View, src: torch.Tensor, src_view: View,
                 parallel: bool = True) -> None:
    """``dst[dst_view] = src[src_view]`` element for element (same sizes, same element width).

    ``parallel=False`` inside tasks already on the pool (``parallel.run_split``): it must not wait on itself.
    """
    if dst_view.sizes != src_view.sizes:
        raise ValueError(f"view sizes differ: {dst_view.sizes} vs {src_view.sizes}")
    if dst.element_size() != src.element_size():
        raise ValueError("strided_copy moves bits: element sizes must match")
    if dst_view.numel() == 0:
        return
    d, s = _as_numpy(dst, dst_view), _as_numpy(src, src_view)
    workers = torch.get_num_threads()
    if not parallel or workers < 2 or dst_view.numel() * dst.element_size() < _PARALLEL_BYTES:
        np.copyto(d, s)
        return
    # Split along the outermost destination dimension that can be split, so chunks write apart.
    order = sorted(range(len(dst_view.sizes)), key=lambda i: -abs(dst_view.strides[i]))
    axis = next((i for i in order if dst_view.sizes[i] >= workers), order[0])
    bounds = np.linspace(0, dst_view.sizes[axis], workers + 1).astype(int)
    chunks = [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
    list(pool(workers).map(lambda lh: _copy_part(d, s, axis, lh), chunks))


def _copy_part(d: np.ndarray, s: np.ndarray, axis: int, lo_hi) -> None:
    sel = (slice(None),) * axis + (slice(*lo_hi),)
    np.copyto(d[sel], s[sel])


def zero_fill(t: torch.Tensor) -> None:
    """``t.zero_()`` for a CPU tensor of any strides, on the calling thread.

    For many small blocks (a row at a time, to stay in cache) an OpenMP parallel region per call
    costs more than the fill, and far more when the cores are shared.
    """
    _as_numpy(t, View(tuple(t.shape), tuple(t.stride()))).fill(0)
