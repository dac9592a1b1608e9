"""masked_im2col forward as one numba loop: the CPU fast path when numba is installed (see ``_core/jit.py``).

Why: the torch path (``cpu.py``) is one ``index_select`` over a ``kh*kw*M`` index row, which runs well
below memory bandwidth (per-element index loads and bounds checks); the RetinaNet-head case needs the
gather to run near copy speed.

How: a small table gives, for every tap and mask point, the element offset of the source inside a
channel plane, or -1 where the tap falls outside the feature. Then each channel plane (tens of KB, so
it stays in L2) is read once from memory, and every tap's row of ``data_col`` is written contiguously.
Values move as raw bits (fp16/bf16 as int16, fp32 as int32, fp64 as int64), so NaN payloads and -0.0
survive exactly as in the reference. Every output element is written by exactly one loop iteration, so
the result does not depend on the thread count.
"""
from __future__ import annotations

import numba
import numpy as np
import torch
from numba import prange

from ..._core.jit import match_torch_threads, njit, njit_variants, use_parallel
from ..._core.memory import new_empty

_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}


def supports(feature: torch.Tensor, *indices: torch.Tensor) -> bool:
    """CPU tensors, a floating feature of a dtype moved here as raw bits, and at least one element."""
    return (all(t.device.type == "cpu" for t in (feature, *indices)) and feature.dtype in _BITS
            and feature.numel() > 0)


# ------------------------------------------------------------------------------------------- kernels
@njit
def _plan(mask_h_idx, mask_w_idx, height, width, stride_h, stride_w, kernel_h, kernel_w, pad_h, pad_w):
    """Where every (tap, mask point) reads, relative to the start of a channel plane.

    Returns ``(origin [M], deltas [kh*kw], border [B, 3])``. A point whose whole window lies inside the
    feature reads tap t at ``origin[m] + deltas[t]``. Every other point has origin 0 (a harmless in-plane
    read that is overwritten) and one ``border`` row ``(t, m, offset)`` per tap, offset -1 meaning 0.
    """
    mask_cnt = mask_h_idx.shape[0]
    taps = kernel_h * kernel_w
    fits = kernel_h <= height and kernel_w <= width  # else no window is inside and deltas stay 0
    deltas = np.zeros(taps, np.int64)
    if fits:
        for i in range(kernel_h):
            for j in range(kernel_w):
                deltas[i * kernel_w + j] = i * stride_h + j * stride_w
    origin = np.zeros(mask_cnt, np.int64)
    inside = np.zeros(mask_cnt, np.bool_)
    border_cnt = 0
    for m in range(mask_cnt):
        # int64 arithmetic as in the torch path (any index value is legal)
        top = np.int64(mask_h_idx[m]) - pad_h
        left = np.int64(mask_w_idx[m]) - pad_w
        if fits and top >= 0 and top <= height - kernel_h and left >= 0 and left <= width - kernel_w:
            inside[m] = True
            origin[m] = top * stride_h + left * stride_w
        else:
            border_cnt += taps
    border = np.empty((border_cnt, 3), np.int64)
    b = 0
    for m in range(mask_cnt):
        if inside[m]:
            continue
        top = np.int64(mask_h_idx[m]) - pad_h
        left = np.int64(mask_w_idx[m]) - pad_w
        for i in range(kernel_h):
            h = top + i
            for j in range(kernel_w):
                w = left + j
                border[b, 0] = i * kernel_w + j
                border[b, 1] = m
                if h >= 0 and h < height and w >= 0 and w < width:
                    border[b, 2] = h * stride_h + w * stride_w
                else:
                    border[b, 2] = -1
                b += 1
    return origin, deltas, border


def _gather(storage, stride_c, origin, deltas, border, data_col):
    """``data_col[c*T + t, m] = storage[c*stride_c + origin[m] + deltas[t]]``, then the border entries.

    Unsigned index arithmetic: every index is in range and non-negative, and numba's wraparound of
    negative indices would otherwise cost a branch per element.
    """
    taps = deltas.shape[0]
    mask_cnt = origin.shape[0]
    channels = data_col.shape[0] // taps
    zero = data_col.dtype.type(0)
    for c in prange(channels):
        base = np.uint64(c * stride_c)
        for t in range(taps):
            row = data_col[c * taps + t]
            src = base + np.uint64(deltas[t])
            for m in range(mask_cnt):
                row[np.uint64(m)] = storage[src + np.uint64(origin[m])]
        for b in range(border.shape[0]):
            offset = border[b, 2]
            data_col[c * taps + border[b, 0], border[b, 1]] = storage[base + np.uint64(offset)] if offset >= 0 else zero


_gather_serial, _gather_parallel = njit_variants(_gather)


# ------------------------------------------------------------------------------------------- entry
def _storage(t: torch.Tensor) -> np.ndarray:
    """Flat numpy view of the raw bits spanned by ``t``, starting at ``t[0, 0, 0, 0]`` (torch strides are
    never negative, so the view covers every element of ``t``)."""
    bits = t.detach().view(_BITS[t.dtype])
    span = 1 + sum((size - 1) * stride for size, stride in zip(bits.shape, bits.stride()))
    return bits.as_strided((span,), (1,)).numpy()


def im2col_forward(feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w):
    """``feature [1, C, H, W]`` (any strides) -> ``data_col [C*kh*kw, M]``, bit-equal to the reference."""
    _, channels, height, width = feature.shape
    mask_cnt = mask_h_idx.shape[0]
    taps = kernel_h * kernel_w
    data_col = new_empty((channels * taps, mask_cnt), feature.dtype, feature.device)
    if mask_cnt == 0:
        return data_col
    storage = _storage(feature)
    _, stride_c, stride_h, stride_w = feature.stride()
    plan = _plan(mask_h_idx.numpy(), mask_w_idx.numpy(), height, width, stride_h, stride_w,
                 kernel_h, kernel_w, pad_h, pad_w)
    out = data_col.view(_BITS[feature.dtype]).numpy()
    if use_parallel(channels * taps * mask_cnt, threshold=2e5):
        match_torch_threads()
        # channels handed out in small chunks: a worker the OS deschedules holds up only its chunk
        with numba.parallel_chunksize(max(1, channels // 32)):
            _gather_parallel(storage, stride_c, *plan, out)
    else:
        _gather_serial(storage, stride_c, *plan, out)
    return data_col
