"""masked_im2col forward and its adjoint as numba loops: the ``numba`` backend (see ``_core/dispatch.py``); col2im
and its adjoint are the torch code of ``cpu.py``, re-exported here (no loop of theirs beats it).

Why: the torch path's ``index_select`` over a ``kh*kw*M`` index row runs well below memory bandwidth; the
RetinaNet-head case needs the gather near copy speed. A small plan gives each point its window's offset
in a channel plane and, per tap, the ascending list of points whose tap falls outside the feature (a few
at the border). Each channel plane (in L2) is read once and every row of ``data_col`` written once, in
order, as raw bits (NaN payloads and -0.0 exact), by one thread per range of channels, so the result does
not depend on the thread count. On x86-64 large outputs use streaming stores: ``data_col`` is not read
back here, and they skip reading each destination line first (a third of the traffic); an ``sfence`` per
channel makes them visible before the threads join.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._core.bits import as_bits, numpy_alias, storage_bits
from ..._core.jit import njit, use_parallel
from ..._core.jit_intrinsics import store_fence, stream_store
from ..._core.memory import new_empty
from ..._core.parallel import even_parts, run_parts
from .cpu import col2im_backward, col2im_forward  # noqa: F401  (the torch code serves these)

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
    taps = kernel_h * kernel_w
    deltas = np.empty(taps, np.int64)
    for t in range(taps):
        deltas[t] = (t // kernel_w) * stride_h + (t % kernel_w) * stride_w
    origin = np.empty(mask_h_idx.shape[0], np.int64)
    border = np.empty(mask_h_idx.shape[0], np.int64)  # the points whose window is not wholly inside
    border_cnt = 0
    for m in range(mask_h_idx.shape[0]):
        top = np.int64(mask_h_idx[m]) - pad_h  # int64 as in the torch path (any index value is legal)
        left = np.int64(mask_w_idx[m]) - pad_w
        origin[m] = top * stride_h + left * stride_w
        if top < 0 or top > height - kernel_h or left < 0 or left > width - kernel_w:
            border[border_cnt] = m
            border_cnt += 1
    outside_start = np.zeros(taps + 1, np.int64)
    outside_m = np.empty(0, np.int64)
    for listing in (False, True):  # count the outside taps, then list them
        n = 0
        for t in range(taps):
            for m in border[:border_cnt]:
                h = np.int64(mask_h_idx[m]) - pad_h + t // kernel_w
                w = np.int64(mask_w_idx[m]) - pad_w + t % kernel_w
                if h < 0 or h >= height or w < 0 or w >= width:
                    if listing:
                        outside_m[n] = m
                    n += 1
            outside_start[t + 1] = n
        if not listing:
            outside_m = np.empty(n, np.int64)
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


@njit
def _add_windows(grad_col, origin, deltas, outside_start, outside_m, out, plane_size, c_lo, c_hi):
    """The adjoint of :func:`_gather` on a contiguous ``out``, zeroed here: ``out[c*plane_size + origin[m] +
    deltas[t]] += grad_col[c*T + t, m]`` for channels ``[c_lo, c_hi)``, skipping the outside taps; taps in order and,
    within a tap, points in order (``cpu.im2col_backward``'s ``index_add_`` order)."""
    taps = deltas.shape[0]
    mask_cnt = origin.shape[0]
    out[c_lo * plane_size:c_hi * plane_size] = 0  # here, not by torch: no OpenMP region just before the threads
    for c in range(c_lo, c_hi):
        for t in range(taps):
            row = grad_col[c * taps + t]
            dst = np.uint64(c * plane_size) + np.uint64(deltas[t])
            start = 0
            for k in range(outside_start[t], outside_start[t + 1] + 1):
                stop = outside_m[k] if k < outside_start[t + 1] else mask_cnt
                for m in range(start, stop):
                    out[dst + np.uint64(origin[m])] += row[np.uint64(m)]
                start = stop + 1


# ------------------------------------------------------------------------------------------- entry
def _channel_parts(channels: int, values: int) -> list[tuple[int, int]]:
    """The ranges of channels handed to the threads for a call moving ``values`` values: a second thread from
    about 5e5 values, where the copying outweighs waking it."""
    threads = torch.get_num_threads() if use_parallel(values, threshold=5e5) else 1
    return even_parts(channels, threads * PARTS_PER_THREAD if threads > 1 else 1)


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
    run_parts(lambda lo, hi: _gather(storage, stride_c, *plan, out, streaming, lo, hi),
              _channel_parts(channels, channels * taps * mask_cnt))
    return data_col


def im2col_backward(grad_col, mask_h_idx, mask_w_idx, channels, height, width, kernel_h, kernel_w, pad_h, pad_w):
    """``cpu.im2col_backward``'s additions in its order, as one loop over :func:`_gather`'s plan:
    ``grad_col [C*kh*kw, M]`` -> ``grad_feature [1, C, H, W]``, the same bits (fp16/bf16 summed in float32,
    rounded once). One thread per range of channels, so the bits do not depend on the thread count."""
    acc_dtype = torch.float64 if grad_col.dtype == torch.float64 else torch.float32
    out = new_empty((channels, height, width), acc_dtype, grad_col.device)
    grad_col = grad_col.reshape(channels * kernel_h * kernel_w, mask_h_idx.shape[0])
    values = numpy_alias(grad_col.to(acc_dtype).contiguous())
    plan = _plan(numpy_alias(mask_h_idx), numpy_alias(mask_w_idx), height, width, width, 1, kernel_h, kernel_w,
                 pad_h, pad_w)
    flat = numpy_alias(out.view(-1))
    run_parts(lambda lo, hi: _add_windows(values, *plan, flat, height * width, lo, hi),
              _channel_parts(channels, values.size))
    return out.unsqueeze(0).to(grad_col.dtype)
