"""masked_im2col forward as one numba loop: the ``numba`` backend (see ``_core/dispatch.py``).
The other directions run the torch code (``cpu.py``), re-exported here: no loop of theirs beats it.

Why: the torch path (``cpu.py``) is one ``index_select`` over a ``kh*kw*M`` index row, which runs well
below memory bandwidth (per-element index loads and bounds checks); the RetinaNet-head case needs the
gather to run near copy speed.

How: a small plan gives each mask point its window's offset in a channel plane (tap t then reads
``origin + deltas[t]``) and, per tap, the ascending list of points whose tap falls outside the feature
(value 0; a few points at the border). Each channel plane (tens of KB, so it stays in L2) is read
once from memory, and every tap's row of ``data_col`` is written once, in order: branch-free runs of
points between that row's outside points.
Values move as raw bits (fp16/bf16 as int16, fp32 as int32, fp64 as int64), so NaN payloads and -0.0
survive exactly as in the reference. Every output element is written by exactly one loop iteration, so
the result does not depend on the thread count: ranges of channels go to cvops's workers
(``_core.parallel.run_parts``).

On x86-64 the rows are written with non-temporal (streaming) stores: ``data_col`` is written once and
not read back here, and streaming stores skip reading each destination line into the cache first
(a third of the memory traffic). An ``sfence`` per channel makes them visible before the threads join.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._core.bits import as_bits, numpy_alias, storage_bits
from ..._core.jit import njit, use_parallel
from ..._core.jit_intrinsics import store_fence, stream_store
from ..._core.memory import new_empty
from ..._core.parallel import even_parts, run_parts
from .cpu import col2im_backward, col2im_forward, im2col_backward  # noqa: F401  (the torch code serves these)

# data_col of at least this many bytes is written with streaming stores (a smaller one is likely still
# in cache when the matmul of MaskedConv2d reads it)
STREAM_MIN_BYTES = 8 << 20
# channel ranges per thread: a worker the OS deschedules holds up only its current range
PARTS_PER_THREAD = 4

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def supports(feature: torch.Tensor, *indices: torch.Tensor) -> bool:
    """CPU tensors and a floating feature of a dtype moved here as raw bits."""
    return all(t.device.type == "cpu" for t in (feature, *indices)) and feature.dtype in SUPPORTED


# ------------------------------------------------------------------------------------------- kernels
@njit
def _plan(mask_h_idx, mask_w_idx, height, width, stride_h, stride_w, kernel_h, kernel_w, pad_h, pad_w):
    """Where every (tap, mask point) reads, relative to the start of a channel plane.

    Returns ``(origin [M], deltas [kh*kw], outside_start [kh*kw + 1], outside_m [K])``: tap t of point
    m reads ``origin[m] + deltas[t]`` unless m is in ``outside_m[outside_start[t]:outside_start[t+1]]``
    (ascending), the points whose tap t falls outside the feature (value 0). The sum is taken modulo
    2**64, so it is the right offset for every inside tap even where ``origin`` alone wrapped.
    """
    mask_cnt = mask_h_idx.shape[0]
    taps = kernel_h * kernel_w
    deltas = np.empty(taps, np.int64)
    for i in range(kernel_h):
        for j in range(kernel_w):
            deltas[i * kernel_w + j] = i * stride_h + j * stride_w
    origin = np.empty(mask_cnt, np.int64)
    outside_cnt = np.zeros(taps, np.int64)
    for m in range(mask_cnt):
        # int64 arithmetic as in the torch path (any index value is legal)
        top = np.int64(mask_h_idx[m]) - pad_h
        left = np.int64(mask_w_idx[m]) - pad_w
        origin[m] = top * stride_h + left * stride_w
        if top >= 0 and top <= height - kernel_h and left >= 0 and left <= width - kernel_w:
            continue
        for i in range(kernel_h):
            for j in range(kernel_w):
                h = top + i
                w = left + j
                if not (h >= 0 and h < height and w >= 0 and w < width):
                    outside_cnt[i * kernel_w + j] += 1
    outside_start = np.zeros(taps + 1, np.int64)
    for t in range(taps):
        outside_start[t + 1] = outside_start[t] + outside_cnt[t]
    outside_m = np.empty(outside_start[taps], np.int64)
    fill = outside_start[:taps].copy()
    for m in range(mask_cnt):
        top = np.int64(mask_h_idx[m]) - pad_h
        left = np.int64(mask_w_idx[m]) - pad_w
        if top >= 0 and top <= height - kernel_h and left >= 0 and left <= width - kernel_w:
            continue
        for i in range(kernel_h):
            for j in range(kernel_w):
                h = top + i
                w = left + j
                if not (h >= 0 and h < height and w >= 0 and w < width):
                    t = i * kernel_w + j
                    outside_m[fill[t]] = m
                    fill[t] += 1
    return origin, deltas, outside_start, outside_m


@njit
def _gather(storage, stride_c, origin, deltas, outside_start, outside_m, data_col, streaming, c_lo, c_hi):
    """``data_col[c*T + t, m] = storage[c*stride_c + origin[m] + deltas[t]]`` for channels ``[c_lo, c_hi)``,
    0 where tap t of point m is outside the feature.

    Each row is written once, in order: branch-free runs of points between the row's outside points,
    with streaming stores if ``streaming``. Unsigned (modulo 2**64) index arithmetic: numba's
    wraparound of negative indices would otherwise cost a branch per element.
    """
    taps = deltas.shape[0]
    mask_cnt = origin.shape[0]
    zero = data_col.dtype.type(0)
    for c in range(c_lo, c_hi):
        base = np.uint64(c * stride_c)
        for t in range(taps):
            row = data_col[c * taps + t]
            src = base + np.uint64(deltas[t])
            start = 0
            for k in range(outside_start[t], outside_start[t + 1] + 1):
                stop = outside_m[k] if k < outside_start[t + 1] else mask_cnt
                if streaming:
                    for m in range(start, stop):
                        stream_store(row, np.uint64(m), storage[src + np.uint64(origin[m])])
                    if stop < mask_cnt:
                        stream_store(row, np.uint64(stop), zero)
                else:
                    for m in range(start, stop):
                        row[np.uint64(m)] = storage[src + np.uint64(origin[m])]
                    if stop < mask_cnt:
                        row[np.uint64(stop)] = zero
                start = stop + 1
        if streaming:
            store_fence()


# ------------------------------------------------------------------------------------------- entry
def im2col_forward(feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w):
    """``feature [1, C, H, W]`` (any strides) -> ``data_col [C*kh*kw, M]``, bit-equal to the reference."""
    _, channels, height, width = feature.shape
    mask_cnt = mask_h_idx.shape[0]
    taps = kernel_h * kernel_w
    data_col = new_empty((channels * taps, mask_cnt), feature.dtype, feature.device)
    if mask_cnt == 0:
        return data_col
    storage = storage_bits(feature)[feature.storage_offset():]  # starts at feature[0, 0, 0, 0]
    _, stride_c, stride_h, stride_w = feature.stride()
    plan = _plan(numpy_alias(mask_h_idx), numpy_alias(mask_w_idx), height, width, stride_h, stride_w,
                 kernel_h, kernel_w, pad_h, pad_w)
    out = numpy_alias(as_bits(data_col))
    streaming = data_col.numel() * data_col.element_size() >= STREAM_MIN_BYTES
    # two threads already gain from about 1e5 gathered values (a fifth of the time saved at twice that)
    threads = torch.get_num_threads() if use_parallel(channels * taps * mask_cnt, threshold=1e5) else 1
    parts = even_parts(channels, threads * PARTS_PER_THREAD if threads > 1 else 1)
    run_parts(lambda lo, hi: _gather(storage, stride_c, *plan, out, streaming, lo, hi), parts)
    return data_col
