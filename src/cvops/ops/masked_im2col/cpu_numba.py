"""masked_im2col forward as one numba loop: the CPU fast path when numba is installed (see ``_core/jit.py``).

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
the result does not depend on the thread count.

On x86-64 the rows are written with non-temporal (streaming) stores: ``data_col`` is written once and
not read back here, and streaming stores skip reading each destination line into the cache first
(a third of the memory traffic). An ``sfence`` per channel makes them visible before the threads join.
"""
from __future__ import annotations

import contextlib

import numba
import numpy as np
import torch
from numba import prange

from ..._core.bits import as_bits, numpy_alias, storage_bits
from ..._core.jit import REASSOCIATE, match_torch_threads, njit, njit_variants, use_parallel
from ..._core.jit_intrinsics import store_fence, stream_store
from ..._core.memory import new_empty

# data_col of at least this many bytes is written with streaming stores (a smaller one is likely still
# in cache when the matmul of MaskedConv2d reads it)
STREAM_MIN_BYTES = 8 << 20

# dynamic scheduling of prange loops (numba >= 0.57); static halves on older versions
_chunksize = getattr(numba, "parallel_chunksize", lambda size: contextlib.nullcontext())

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def supports(feature: torch.Tensor, *indices: torch.Tensor) -> bool:
    """CPU tensors, a floating feature of a dtype moved here as raw bits, and at least one element."""
    return (all(t.device.type == "cpu" for t in (feature, *indices)) and feature.dtype in SUPPORTED
            and feature.numel() > 0)


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


def _gather(storage, stride_c, origin, deltas, outside_start, outside_m, data_col, streaming):
    """``data_col[c*T + t, m] = storage[c*stride_c + origin[m] + deltas[t]]``, 0 where tap t of point m is
    outside the feature.

    Each row is written once, in order: branch-free runs of points between the row's outside points,
    with streaming stores if ``streaming``. Unsigned (modulo 2**64) index arithmetic: numba's
    wraparound of negative indices would otherwise cost a branch per element.
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


_gather_serial, _gather_parallel = njit_variants(_gather)


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
    if use_parallel(channels * taps * mask_cnt, threshold=1e5):
        match_torch_threads()
        # channels handed out in small chunks: a worker the OS deschedules holds up only its chunk
        with _chunksize(max(1, channels // 32)):
            _gather_parallel(storage, stride_c, *plan, out, streaming)
    else:
        _gather_serial(storage, stride_c, *plan, out, streaming)
    return data_col


# ------------------------------------------------------------------------------- direct masked conv
DIRECT_BLOCK = 32  # points whose windows are gathered together (32 x C*kh*kw values stay in L2)


@njit(fastmath=REASSOCIATE)
def _direct(feature, channels, height, width, points, out_w, weight, bias, kernel_h, kernel_w, pad_h, pad_w,
            out, block):
    """``out[o, p] = bias[o] + sum_k weight[o, k] * window(p)[k]`` at every point ``p = h*out_w + w`` of
    ``points`` (``out [O, out_h*out_w]`` is zero-filled by the caller; ``feature`` is the flat contiguous
    ``[C, H, W]`` map). The windows (``k = (c*kh + i)*kw + j``, 0 outside the feature) of ``block``
    points are gathered channel plane by plane (each plane is read while it is in cache) into a small
    buffer, then one dot product per (point, output channel): no ``data_col`` in memory, and the sums
    over k vectorise. Unsigned indices: no negative-index wrap test per load."""
    out_channels, window = weight.shape
    plane = height * width
    taps = kernel_h * kernel_w
    cols = np.zeros((block, window), feature.dtype)
    origin = np.full(block, -1, np.int64)  # window start in a plane; -1: over the border
    for b0 in range(0, points.shape[0], block):
        nb = min(block, points.shape[0] - b0)
        for m in range(nb):
            p = points[b0 + m]
            top, left = p // out_w - pad_h, p % out_w - pad_w
            if top >= 0 and top + kernel_h <= height and left >= 0 and left + kernel_w <= width:
                origin[m] = top * width + left
            else:
                origin[m] = -1
                for c in range(channels):  # a window over the border: taps outside the feature read 0
                    for i in range(kernel_h):
                        y = top + i
                        for j in range(kernel_w):
                            x = left + j
                            inside = y >= 0 and y < height and x >= 0 and x < width
                            cols[m, (c * kernel_h + i) * kernel_w + j] = (
                                feature[c * plane + y * width + x] if inside else 0)
        for c in range(channels):
            for m in range(nb):
                if origin[m] >= 0:
                    dst = cols[m]
                    k = np.uint64(c * taps)
                    row = np.uint64(c * plane + origin[m])
                    if kernel_w == 3:  # the common 3-wide window, unrolled
                        for i in range(kernel_h):
                            dst[k] = feature[row]
                            dst[k + np.uint64(1)] = feature[row + np.uint64(1)]
                            dst[k + np.uint64(2)] = feature[row + np.uint64(2)]
                            k += np.uint64(3)
                            row += np.uint64(width)
                    else:
                        for i in range(kernel_h):
                            for j in range(kernel_w):
                                dst[k + np.uint64(j)] = feature[row + np.uint64(j)]
                            k += np.uint64(kernel_w)
                            row += np.uint64(width)
        for m in range(nb):
            p = points[b0 + m]
            for o in range(out_channels):
                acc = out[o, p]  # the caller's zero, in out's dtype
                for k in range(window):
                    acc += weight[o, np.uint64(k)] * cols[m, np.uint64(k)]
                out[o, p] = acc + bias[o]


def masked_conv2d_direct(features, points, out_size, weight, bias, padding):
    """``masked_conv2d`` at ``points`` (flat, ascending ``h*out_w + w``) of an ``out_size`` output without
    autograd (see :func:`_direct`); float32/float64, the same values as the gather-and-multiply route
    within the accumulating-op tolerance."""
    _, channels, height, width = features.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    out_h, out_w = out_size
    out = torch.zeros((1, out_channels, out_h, out_w), dtype=features.dtype)
    if bias is None:
        bias = features.new_zeros(out_channels)
    _direct(numpy_alias(features.contiguous().view(-1)), channels, height, width, numpy_alias(points),
            out_w, numpy_alias(weight.reshape(out_channels, -1)), numpy_alias(bias), kernel_h, kernel_w,
            padding[0], padding[1], numpy_alias(out.view(out_channels, -1)), DIRECT_BLOCK)
    return out


@njit(fastmath=REASSOCIATE)
def _tap_sum(taps, height, width, points, out_w, bias, kernel_h, kernel_w, pad_h, pad_w, out):
    """``out[o, p] = bias[o] + sum_{i,j} taps[(i*kw + j)*O + o, (h - pad_h + i)*W + (w - pad_w + j)]``
    at every point ``p = h*out_w + w`` of ``points``, taps outside the feature left out (they read 0).
    ``taps [kh*kw*O, H*W]`` holds every tap's weight times every feature position; it is walked one
    row at a time (the points are sorted, so each row is read front to back)."""
    out_channels = bias.shape[0]
    for o in range(out_channels):
        for m in range(points.shape[0]):
            out[o, points[m]] = bias[o]
    for i in range(kernel_h):
        for j in range(kernel_w):
            for o in range(out_channels):
                row = taps[(i * kernel_w + j) * out_channels + o]
                for m in range(points.shape[0]):
                    p = points[m]
                    y, x = p // out_w - pad_h + i, p % out_w - pad_w + j
                    if y >= 0 and y < height and x >= 0 and x < width:
                        out[o, p] += row[np.uint64(y * width + x)]


def tap_sum(taps, points, out_size, bias, kernel, padding, height, width):
    """The taps route's last step (see :func:`_tap_sum`): ``[1, O, out_h, out_w]``, zeros off ``points``."""
    out_channels = taps.shape[0] // (kernel[0] * kernel[1])
    out_h, out_w = out_size
    out = torch.zeros((1, out_channels, out_h, out_w), dtype=taps.dtype)
    if bias is None:
        bias = taps.new_zeros(out_channels)
    _tap_sum(numpy_alias(taps), height, width, numpy_alias(points), out_w, numpy_alias(bias), kernel[0], kernel[1],
             padding[0], padding[1], numpy_alias(out.view(out_channels, -1)))
    return out
