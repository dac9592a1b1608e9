"""psroipool as compiled loops: the ``numba`` backend (see ``_core/dispatch.py``).

* forward: each image is walked in bands of the rows (and columns) its RoIs' bins cover. A band is regrouped by
  8 x 8 register transposes (``_core.jit_access.transpose``) into a scratch ``[k, y, x, 0:od]``, so that the od
  channels a bin reads (input channel ``ctop*K + k``, K = PH*PW) are one run; each bin adds its pixels' runs,
  rows then columns, into 24 lanes held in registers (three chains of additions side by side), and the last
  pass divides by the bin area. That is the reference's order of summation: the same bits, NaN/inf included.
  From NCHW storage only the box around each group's bins is regrouped (a plane holds one group).
* backward: the adjoint, band by band over every row of the used images: each bin adds ``top_grad / area`` to
  its pixels' runs RoI by RoI (the reference's order, no atomics), and the box around the band's bins is
  written out by the inverse transposes, zeros elsewhere. Another mapping_channel than the forward's sends each
  value to the run of its own channel.

Threads: the forward splits the bins by the row they start on, the backward the rows of the gradient; every
output element has one writer, so the bits do not depend on the thread count. Bin edges come from
:func:`_edges` (both conventions) in the accumulation dtype (float32; float64 for float64 input).

Memory besides inputs and outputs: a band scratch per thread (``BAND_BYTES``, or one image row when larger:
``W * K * S`` elements, S = od rounded up to 8), the forward's sums or the backward's ``top_grad / area``
(``R * K * S`` elements) and the edges (``16 * R * max(PH, PW)`` bytes). 16-bit floats are read and written
in place through their bits.
"""
from __future__ import annotations

import functools
import threading

import numba
import numpy as np
import torch

from ..._core.bits import numpy_alias
from ..._core.jit import njit, use_parallel
from ..._core.jit_access import load, store, transpose
from ..._core.jit_intrinsics import add8 as _add8, load8 as _get8, store8 as _put8, zero8 as _zero8
from ..._core.layout import empty_nchw
from ..._core.parallel import even_parts, run_parts
from . import checks, cpu

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
BAND_BYTES = 1 << 20  # band scratch: regrouped rows stay in L2 while the bins read them
_LANES = 8
_STAGED_CHANNELS = 2048  # NHWC backward: pixels with more channels go out through a staging run


def supports(*tensors: torch.Tensor) -> bool:
    """CPU tensors of a dtype this path handles (floating inputs; index tensors are checked elsewhere)."""
    return all(t.is_cpu for t in tensors) and tensors[0].dtype in SUPPORTED


def _storage(t: torch.Tensor) -> np.ndarray:
    """The flat numpy array over a dense tensor's storage (16-bit floats as their bits: float16 as uint16,
    bfloat16 as int16, see ``_core.jit_access``)."""
    if t.dtype in (torch.float16, torch.bfloat16):
        bits = numpy_alias(t.view(torch.int16)).reshape(-1)
        return bits.view(np.uint16) if t.dtype == torch.float16 else bits
    return numpy_alias(t).reshape(-1)


def _dense(t: torch.Tensor) -> tuple[np.ndarray, tuple[int, ...]]:
    """(flat storage, element strides of the logical NCHW view ``t`` in that storage: ``(CHW, HW, W, 1)`` for NCHW
    order, ``(HWC, 1, WC, C)`` for NHWC order); a copy only when ``t`` is neither dense NCHW nor dense NHWC."""
    t = t.detach()
    if not (t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)):
        t = t.contiguous()
    _, c, h, w = t.shape
    if t.is_contiguous():
        return _storage(t), (c * h * w, h * w, w, 1)
    return _storage(t.permute(0, 2, 3, 1)), (h * w * c, 1, w * c, c)


# ------------------------------------------------------------------------------------------------- bin edges
@njit(error_model="numpy")
def _round_half_away(v, dt):
    t = dt(int(v)) if abs(v) < dt(4503599627370496.0) else v  # trunc; 2**52 and more are integral already
    if abs(v - t) >= dt(0.5):
        return t + dt(1.0) if v > 0 else t - dt(1.0)
    return t


@njit(error_model="numpy")
def _axis_edges(c1, c2, scale, bins, limit, torchvision, edges, i, row, dt):
    """Bin edges along one axis of RoI i: ``edges[i, row, p]`` = start, ``edges[i, row + 1, p]`` = end of bin p,
    in either convention (the package docstring), one rounding per operation in ``dt`` (no fused multiply-add);
    a NaN edge (a scaled corner that overflowed) gives 0."""
    if torchvision:
        start = _round_half_away(c1 * scale, dt)
        size = _round_half_away(c2 * scale, dt) - start
        if not size >= dt(1.0):
            size = dt(1.0)
        shift, offset, top = dt(0.0), start, dt(limit - 1)
    else:
        start = _round_half_away(c1, dt) * scale
        size = (_round_half_away(c2, dt) + dt(1.0)) * scale - start
        if dt(0.1) > size:
            size = dt(0.1)
        shift, offset, top = start, dt(0.0), dt(limit)
    bin_size = size / dt(bins)
    for p in range(bins):
        lo = np.floor(dt(p) * bin_size + shift) + offset
        hi = np.ceil(dt(p + 1) * bin_size + shift) + offset
        lo = lo if lo > 0 else dt(0.0)
        hi = hi if hi > 0 else dt(0.0)
        edges[i, row, p] = np.int32(lo if lo < top else top)
        edges[i, row + 1, p] = np.int32(hi if hi < top else top)


@njit(error_model="numpy")
def _edges(rois, scale, ph_n, pw_n, height, width, torchvision):
    """(int32 [R, 4, max(PH, PW)], work): rows hs, he (bin rows) and ws, we (bin columns) of every RoI, computed in
    the dtype of ``scale`` (a 1-element array), and the RoIs' summed bin area and the pixels of the box around all
    of them (how much a call reads). The RoI values were checked (finite corners, batch indices in range)."""
    dt = scale.dtype.type
    scale = scale[0]
    edges = np.zeros((rois.shape[0], 4, max(ph_n, pw_n)), np.int32)
    area, y0, y1, x0, x1 = 0, height, 0, width, 0
    for i in range(rois.shape[0]):
        for row in range(0, 4, 2):  # rows (y corners) then columns (x corners); one call site, one compilation
            bins, limit = (ph_n, height) if row == 0 else (pw_n, width)
            _axis_edges(dt(rois[i, 2 - row // 2]), dt(rois[i, 4 - row // 2]), scale, bins, limit, torchvision, edges,
                        i, row, dt)
        rows, cols = 0, 0
        for p in range(ph_n):
            rows += max(edges[i, 1, p] - edges[i, 0, p], 0)
        for p in range(pw_n):
            cols += max(edges[i, 3, p] - edges[i, 2, p], 0)
        area += rows * cols
        y0, y1 = min(y0, edges[i, 0, 0]), max(y1, edges[i, 1, ph_n - 1])
        x0, x1 = min(x0, edges[i, 2, 0]), max(x1, edges[i, 3, pw_n - 1])
    return edges, area, max(y1 - y0, 0) * max(x1 - x0, 0)


# ------------------------------------------------------------------------------------------- runs of channels
def _run_length(od: int) -> int:
    """Scratch entries per bin run: od rounded up to whole 8-lane blocks (the lanes past od are never written out)."""
    return -(-od // _LANES) * _LANES


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _spread_window(src, s, dst, first, row_step, rows, cols, col_step, length):
    """The adjoint of :func:`_sum_window`: ``dst[first + y*row_step + x*col_step + j] += src[s + j]``; per 8-lane
    block one flat loop over the window's pixels (the next row's step taken without a branch)."""
    wrap = row_step - np.uint64(cols - 1) * col_step
    for b in range(0, length, _LANES):
        u = np.uint64(b)
        value = _get8(src, s + u)
        at, x = first + u, 1
        for _ in range(rows * cols):
            _put8(dst, at, _add8(_get8(dst, at), value))
            at += wrap if x == cols else col_step
            x = 1 if x == cols else x + 1


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _sum3(src, first, row_step, rows, cols, col_step, dst, d, u0, u1, u2, fresh):
    """:func:`_sum_window` of the three 8-lane blocks at offsets u0, u1, u2 at once: three independent chains of
    additions, each in the reference's order."""
    z = _zero8(dst)
    a0, a1, a2 = (z, z, z) if fresh else (_get8(dst, d + u0), _get8(dst, d + u1), _get8(dst, d + u2))
    for y in range(rows):
        at = first + np.uint64(y) * row_step
        for x in range(cols):
            p = at + np.uint64(x) * col_step
            a0, a1, a2 = _add8(a0, _get8(src, p + u0)), _add8(a1, _get8(src, p + u1)), _add8(a2, _get8(src, p + u2))
    _put8(dst, d + u0, a0)
    _put8(dst, d + u1, a1)
    _put8(dst, d + u2, a2)


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _sum_window(src, first, row_step, rows, cols, col_step, dst, d, length, fresh):
    """``dst[d + j] += sum of src[first + y*row_step + x*col_step + j]`` over y < rows, x < cols (rows then
    columns, the reference's order), for j < length: 24 lanes at a time (:func:`_sum3`: one chain of additions
    is bound by the adder's latency, so three run side by side), then the blocks left 8 at a time."""
    b = 0
    while length - b >= 3 * _LANES:
        _sum3(src, first, row_step, rows, cols, col_step, dst, d, np.uint64(b), np.uint64(b + _LANES),
              np.uint64(b + 2 * _LANES), fresh)
        b += 3 * _LANES
    for b in range(b, length, _LANES):
        u = np.uint64(b)
        a = _zero8(dst) if fresh else _get8(dst, d + u)
        for y in range(rows):
            at = first + np.uint64(y) * row_step + u
            for x in range(cols):
                a = _add8(a, _get8(src, at + np.uint64(x) * col_step))
        _put8(dst, d + u, a)


@njit(error_model="numpy")
def _regroup(x, xs, b, y0, y1, x0, x1, groups, od, run, plane, g, boxes):
    """Rows [y0, y1) x columns [x0, x1) of image b into ``g`` as ``[k, y, x, 0:od]`` runs of ``run`` entries (input
    channel ``ctop*K + k`` at ``k*plane + pixel*run + ctop``) by transposes of each pixel's ``[ctop, k]`` channels
    (NHWC) or of each plane's ``[ctop, x]`` rows (NCHW: only the box ``boxes[k]`` around group k's bins)."""
    wc = x1 - x0
    for y in range(y0, y1):
        row, at = (y - y0) * wc * run, b * xs[0] + y * xs[2]
        if xs[1] == 1:
            for xx in range(x0, x1):
                transpose(x, at + xx * xs[3], groups, od, groups, g, row + (xx - x0) * run, plane)
        else:
            for k in range(groups):
                if boxes[k, 0] <= y < boxes[k, 1] and boxes[k, 3] > boxes[k, 2]:
                    transpose(x, at + k * xs[1] + boxes[k, 2], groups * xs[1], od, boxes[k, 3] - boxes[k, 2], g,
                              k * plane + row + (boxes[k, 2] - x0) * run, run)


@njit(error_model="numpy")
def _group_boxes(rois, edges, b, yb, ye, y_lo, y_hi, ph_n, pw_n, boxes):
    """``boxes[k]`` = (y0, y1, x0, x1): the box around the pixels in rows [yb, ye) of the bins of group k of image
    b whose first row is in [y_lo, y_hi) (empty where there are none)."""
    boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3] = ye, yb, 1 << 30, 0
    for i in range(rois.shape[0]):
        if int(rois[i, 0]) != b or edges[i, 0, 0] >= ye or edges[i, 1, ph_n - 1] <= yb:
            continue
        for ph in range(ph_n):
            hs, he = max(edges[i, 0, ph], yb), min(edges[i, 1, ph], ye)
            if he <= hs or not y_lo <= edges[i, 0, ph] < y_hi:
                continue
            for pw in range(pw_n):
                k = ph * pw_n + pw
                boxes[k, 0], boxes[k, 1] = min(boxes[k, 0], hs), max(boxes[k, 1], he)
                boxes[k, 2], boxes[k, 3] = min(boxes[k, 2], edges[i, 2, pw]), max(boxes[k, 3], edges[i, 3, pw])


@njit(error_model="numpy")
def _ungroup(acc, b, yb, ye, width, groups, od, run, plane, bottom, bs, boxes):
    """The inverse of :func:`_regroup` for rows [yb, ye) (the band in ``acc``): ``acc`` ``[k, y - yb, x, 0:od]`` runs
    -> image b of bottom, group k over the box ``boxes[k]`` (NHWC storage: ``boxes[0]``, the box around all
    groups) and zeros elsewhere; the entries of ``acc`` read are zeroed again (while they are in cache) for the
    next band."""
    for k in range(groups if bs[1] != 1 else 1):
        y0, y1, x0, x1 = max(boxes[k, 0], yb), min(boxes[k, 1], ye), boxes[k, 2], boxes[k, 3]
        if x1 <= x0:
            y0, y1, x0, x1 = ye, ye, width, width
        for y in range(yb, ye):
            lo, hi = (x0, x1) if y0 <= y < y1 else (width, width)
            if lo > 0 or hi < width:
                _zero_row(bottom, bs, b, y, k, groups, od, lo, hi, width)
        for y in range(y0, y1):
            row, at = ((y - yb) * width + x0) * run, b * bs[0] + y * bs[2] + x0 * bs[3]
            if bs[1] != 1:
                transpose(acc, k * plane + row, run, x1 - x0, od, bottom, at + k * bs[1], groups * bs[1])
                acc[k * plane + row:k * plane + row + (x1 - x0) * run] = 0
                continue
            for xx in range(x1 - x0):
                if groups * od <= _STAGED_CHANNELS:
                    transpose(acc, row + xx * run, plane, groups, od, bottom, at + xx * bs[3], groups)
                else:  # a long pixel: transposed into a staging run after the planes, then copied out whole
                    stage = np.uint64(groups * plane)
                    transpose(acc, row + xx * run, plane, groups, od, acc, stage, groups)
                    d = np.uint64(at + xx * bs[3])
                    for c in range(groups * od):
                        store(bottom, d + np.uint64(c), acc[stage + np.uint64(c)])
            for kk in range(groups):
                acc[kk * plane + row:kk * plane + row + (x1 - x0) * run] = 0


@njit(error_model="numpy")
def _zero_row(bottom, bs, b, y, k, groups, od, lo, hi, width):
    """Zeros in row y of image b of bottom outside columns [lo, hi): in the channels of group k (NCHW storage) or
    in all channels (NHWC storage). Zero bits are +0.0 in every float dtype."""
    if bs[1] != 1:
        for ctop in range(od):
            at = b * bs[0] + (ctop * groups + k) * bs[1] + y * bs[2]
            bottom[at:at + lo] = 0
            bottom[at + hi:at + width] = 0
    else:  # NHWC: pixels of groups*od channels (bs[3] is 1, not that, when H = W = 1)
        at, pixel = b * bs[0] + y * bs[2], groups * od
        bottom[at:at + lo * pixel] = 0
        bottom[at + hi * pixel:at + width * pixel] = 0


# ------------------------------------------------------------------------------------------------------ kernels
@njit(error_model="numpy")
def _forward(x, xs, n, height, width, rois, edges, ph_n, pw_n, od, run, band_rows, sums, out, os, y_lo, y_hi, g):
    """The forward of the bins whose first row is in [y_lo, y_hi) (see the module docstring): each bin is summed
    by one call, so a split of the rows changes nothing. ``sums``: accumulators [R*K*run] (accumulation dtype, also
    that of ``g``, the band scratch; each bin's are zeroed at its first row); out: flat storage with the strides of
    its logical NCHW view."""
    r = rois.shape[0]
    groups = ph_n * pw_n
    u_run = np.uint64(run)
    boxes = np.empty((groups, 4), np.int64)
    for b in range(n):
        y0, y1, x0, x1 = height, np.int64(0), width, np.int64(0)  # the rows and columns this call's bins cover
        for i in range(r):
            if int(rois[i, 0]) == b:
                for ph in range(ph_n):
                    if y_lo <= edges[i, 0, ph] < y_hi:
                        y0, y1 = min(y0, edges[i, 0, ph]), max(y1, edges[i, 1, ph])
                        x0, x1 = min(x0, edges[i, 2, 0]), max(x1, edges[i, 3, pw_n - 1])
        wc = np.uint64(max(x1 - x0, 0))
        plane = np.uint64(band_rows) * wc * u_run
        for yb in range(y0, y1, band_rows):
            ye = min(yb + band_rows, y1)
            if xs[1] != 1:
                _group_boxes(rois, edges, b, yb, ye, y_lo, y_hi, ph_n, pw_n, boxes)
            _regroup(x, xs, b, yb, ye, x0, x1, groups, od, run, plane, g, boxes)
            for i in range(r):
                if int(rois[i, 0]) != b or edges[i, 0, 0] >= ye or edges[i, 1, ph_n - 1] <= yb:
                    continue
                for ph in range(ph_n):
                    hs, he = max(edges[i, 0, ph], yb), min(edges[i, 1, ph], ye)
                    if he <= hs or not y_lo <= edges[i, 0, ph] < y_hi:
                        continue
                    for pw in range(pw_n):
                        ws, we = edges[i, 2, pw], edges[i, 3, pw]
                        k = np.uint64(ph * pw_n + pw)
                        if we > ws:
                            d = (np.uint64(i * groups) + k) * u_run
                            first = k * plane + (np.uint64(hs - yb) * wc + np.uint64(ws - x0)) * u_run
                            _sum_window(g, first, wc * u_run, he - hs, we - ws, u_run, sums, d, run,
                                        edges[i, 0, ph] >= yb)  # the bin's first band: its sums start at 0
    dt, step = sums.dtype.type, np.uint64(os[1])
    for i in range(r):
        for ph in range(ph_n):
            if y_lo <= edges[i, 0, ph] < y_hi:
                for pw in range(pw_n):
                    area = dt((edges[i, 1, ph] - edges[i, 0, ph]) * (edges[i, 3, pw] - edges[i, 2, pw]))
                    _divide_run(sums, np.uint64((i * groups + ph * pw_n + pw) * run), np.uint64(1), out,
                                np.uint64(i * os[0] + ph * os[2] + pw * os[3]), step, od, area)


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _divide_run(src, s, s_step, dst, d, d_step, od, area):
    """``dst[d + c*d_step] = src[s + c*s_step] / area`` for c < od, or 0 where ``area`` is 0 (an empty bin: bin
    edges never cross, so an area is never negative); vector code where both runs are contiguous (NHWC)."""
    if area == 0:
        for c in range(od):
            store(dst, d + np.uint64(c) * d_step, area)
    elif s_step == 1 and d_step == 1:
        for c in range(od):
            store(dst, d + np.uint64(c), load(src, s + np.uint64(c)) / area)
    else:
        for c in range(od):
            store(dst, d + np.uint64(c) * d_step, load(src, s + np.uint64(c) * s_step) / area)


@njit(error_model="numpy")
def _scaled_top(top, ts, edges, ph_n, pw_n, od, run, diffs, i0, i1, _unused):
    """``diffs[(i*K + k)*run + ctop] = top_grad[i, ctop, ph, pw] / area`` for RoIs [i0, i1), in the accumulation
    dtype of ``diffs`` (0 for an empty bin)."""
    for i in range(i0, i1):
        for ph in range(ph_n):
            for pw in range(pw_n):
                area = diffs.dtype.type((edges[i, 1, ph] - edges[i, 0, ph]) * (edges[i, 3, pw] - edges[i, 2, pw]))
                _divide_run(top, np.uint64(i * ts[0] + ph * ts[2] + pw * ts[3]), np.uint64(ts[1]), diffs,
                            np.uint64(((i * ph_n + ph) * pw_n + pw) * run), np.uint64(1), od, area)


@njit(error_model="numpy")
def _backward(diffs, rois, edges, dest, canonical, ph_n, pw_n, od, run, n, height, width, band_rows, bottom, bs,
              y_lo, y_hi, acc):
    """The backward of rows [y_lo, y_hi) of every image (see the module docstring). ``diffs``: top_grad / area
    of every bin (:func:`_scaled_top`); ``acc``: the band scratch; unless ``canonical`` (the forward's mapping),
    value ``ctop`` of bin ``(i, k)`` goes to entry ``dest[(i*K + k)*od + ctop]`` of a pixel's runs."""
    r = rois.shape[0]
    groups = ph_n * pw_n
    u_run = np.uint64(run)
    plane = band_rows * width * run  # acc entries per channel group k
    u_width = np.uint64(width)
    acc[:groups * plane] = 0  # zero once: the entries written are zeroed again as they are written out
    boxes = np.empty((groups, 4), np.int64)
    for b in range(n):
        for yb in range(y_lo, y_hi, band_rows):
            ye = min(yb + band_rows, y_hi)
            _group_boxes(rois, edges, b, yb, ye, 0, height + 1, ph_n, pw_n, boxes)
            if not canonical or bs[1] == 1:  # one box around every group's bins
                boxes[:, 0], boxes[:, 1] = boxes[:, 0].min(), boxes[:, 1].max()
                boxes[:, 2], boxes[:, 3] = boxes[:, 2].min(), boxes[:, 3].max()
            for i in range(r):
                if int(rois[i, 0]) != b or edges[i, 0, 0] >= ye or edges[i, 1, ph_n - 1] <= yb:
                    continue
                for ph in range(ph_n):
                    hs, he = max(edges[i, 0, ph], yb), min(edges[i, 1, ph], ye)
                    if he <= hs:
                        continue
                    for pw in range(pw_n):
                        ws, we = edges[i, 2, pw], edges[i, 3, pw]
                        if we <= ws:
                            continue
                        k = ph * pw_n + pw
                        s = np.uint64((i * groups + k) * run)
                        first = (np.uint64(hs - yb) * u_width + np.uint64(ws)) * u_run
                        if canonical:
                            _spread_window(diffs, s, acc, first + np.uint64(k * plane), u_width * u_run,
                                           he - hs, we - ws, u_run, run)
                            continue
                        e = (i * groups + k) * od
                        for y in range(hs, he):
                            for xx in range(ws, we):
                                pixel = (np.uint64(y - yb) * u_width + np.uint64(xx)) * u_run
                                for ctop in range(od):
                                    acc[pixel + np.uint64(dest[e + ctop])] += diffs[s + np.uint64(ctop)]
            _ungroup(acc, b, yb, ye, width, groups, od, run, plane, bottom, bs, boxes)


@njit(error_model="numpy")
def _tile(pattern, mapping, i0, i1, _unused):
    """``mapping`` (flat storage) of RoIs [i0, i1) = ``pattern``, one RoI's forward mapping_channel."""
    size = pattern.shape[0]
    for i in range(i0, i1):
        for j in range(size):
            mapping[np.uint64(i * size + j)] = pattern[j]


@njit(error_model="numpy")
def _mapping_kind(mapping, pattern, limit, kinds, i0, i1):
    """``kinds[i0]`` for RoIs [i0, i1): 0 where ``mapping`` (flat storage) repeats ``pattern`` (the forward's), 1
    for another mapping in [0, channels), -1 for an entry outside (``limit``: ``[channels]`` unsigned, so one
    compare finds negative entries too)."""
    size = pattern.shape[0]
    unsigned, channels = limit.dtype.type, limit[0]
    bad, other = 0, 0  # integer OR reductions: vector code (boolean ones are not)
    for i in range(i0, i1):
        base = np.uint64(i * size)
        for j in range(size):
            c = mapping[base + np.uint64(j)]
            bad |= unsigned(c) >= channels
            other |= c ^ pattern[j]
    kinds[i0] = -1 if bad else int(other != 0)


# ----------------------------------------------------------------------------------------------------- wrappers
_SCRATCH = threading.local()
PARALLEL_WORK = 1e6  # elements read or summed from which a call goes to the threads (jit.use_parallel)
BACKWARD_PARTS = 2  # per thread (a forward has one per thread: each also regroups the rows its bins reach)


def _band_scratch(size: int, dtype) -> np.ndarray:
    """The band scratch, kept per thread (a fresh buffer would be page-faulted in on every call)."""
    buf = _SCRATCH.__dict__.get(dtype)
    if buf is None or buf.shape[0] < size:
        buf = _SCRATCH.__dict__[dtype] = np.empty(max(size, 1), dtype)
    return buf


def _split(kernel, args, parts, scratch: int, acc) -> None:
    """``kernel(*args, lo, hi, band_scratch)`` for each ``(lo, hi)`` of ``parts`` (``_core.parallel.run_parts``),
    each thread with its own band scratch; the parts write disjoint outputs."""
    run_parts(lambda lo, hi: kernel(*args, lo, hi, _band_scratch(scratch, acc)), parts)


@functools.lru_cache(maxsize=16)
def _pattern(od: int, ph_n: int, pw_n: int, layout: str) -> np.ndarray:
    """One RoI's forward mapping_channel ``(ctop*PH + ph)*PW + pw`` in the storage order of ``layout``, flat."""
    nchw = np.arange(od * ph_n * pw_n, dtype=np.int32).reshape(od, ph_n, pw_n)
    return np.ascontiguousarray(nchw if layout == "NCHW" else nchw.transpose(1, 2, 0)).reshape(-1)


def _plan(rois: torch.Tensor, dtype: torch.dtype, ph_n, pw_n, spatial_scale, height, width, od, convention):
    """(rois array, bin edges, summed bin area, pixels of the box around the RoIs, accumulation dtype, run length,
    rows per band: as many as ``BAND_BYTES`` hold, at least one)."""
    acc = np.float64 if dtype == torch.float64 else np.float32
    r = rois.detach()
    r = numpy_alias((r if r.dtype in (torch.float32, torch.float64) else r.float()).contiguous())
    edges, area, box = _edges(r, np.array([spatial_scale], acc), ph_n, pw_n, height, width, convention == "torchvision")
    run = _run_length(od)
    band_rows = max(1, min(height, BAND_BYTES // (width * ph_n * pw_n * run * np.dtype(acc).itemsize)))
    return r, edges, area, box, acc, run, band_rows


def _threads(work: float) -> int:
    """Threads for a call of about ``work`` elements read or summed: torch's count, or 1 for a short call."""
    return torch.get_num_threads() if use_parallel(work, PARALLEL_WORK) else 1


def forward(input, rois, pooled_height, pooled_width, spatial_scale, output_dim, out_layout="NCHW",
            convention="rfcn"):
    """As :func:`cpu.forward`: (output, mapping_channel) as logical NCHW views of tensors stored in ``out_layout``.
    The caller checked the RoI values. The bins are split over the threads by their first row."""
    if input.numel() == 0 or rois.shape[0] == 0:  # nothing to pool: the torch code writes the mapping and zeros
        return cpu.forward(input, rois, pooled_height, pooled_width, spatial_scale, output_dim, out_layout, convention)
    n, c, h, w = input.shape
    r, od, groups = rois.shape[0], output_dim, pooled_height * pooled_width
    rois_np, edges, area, box, acc, run, band_rows = _plan(rois, input.dtype, pooled_height, pooled_width,
                                                           spatial_scale, h, w, od, convention)
    shape = (r, od, pooled_height, pooled_width)
    output = empty_nchw(shape, out_layout, like=input)
    mapping = empty_nchw(shape, out_layout, like=rois.new_empty(0, dtype=torch.int32))
    (x, xs), (out, os), (flat_mapping, _) = _dense(input), _dense(output), _dense(mapping)
    _split(_tile, (_pattern(od, pooled_height, pooled_width, out_layout), flat_mapping),
           even_parts(r, _threads(r * groups * od)), 1, acc)
    sums = np.empty(r * groups * run, acc)
    parts = [(lo, hi if hi < h else h + 1) for lo, hi in even_parts(h, _threads(box * c + area * od))]
    _split(_forward, (x, xs, n, h, w, rois_np, edges, pooled_height, pooled_width, od, run, band_rows, sums, out, os),
           parts, band_rows * w * groups * run, acc)  # the last part also takes the bins clamped to row H
    return output, mapping


def _mapping_is_canonical(mapping_channel, channels: int) -> bool:
    """Whether mapping_channel is the forward's (every RoI's channels ``(ctop*PH + ph)*PW + pw``); raises naming
    the value where an entry is outside [0, channels)."""
    r, od, ph_n, pw_n = mapping_channel.shape
    flat, strides = _dense(mapping_channel)
    pattern = _pattern(od, ph_n, pw_n, "NCHW" if strides[3] == 1 else "NHWC")  # od == 1: either order is one
    kinds = np.zeros(max(r, 1), np.int64)
    limit = np.array([channels], np.uint32 if flat.itemsize == 4 else np.uint64)
    run_parts(lambda lo, hi: _mapping_kind(flat, pattern, limit, kinds, lo, hi),
              even_parts(r, _threads(r * od * ph_n * pw_n)))
    if kinds.min() < 0:
        checks.check_mapping_values(checks.OP_BACKWARD, mapping_channel, channels)  # raises, naming the value
    return kinds.max() == 0


def backward(top_grad, rois, mapping_channel, spatial_scale, output_dim, input_shape, out_layout="NCHW",
             trusted_mapping=False, convention="rfcn"):
    """As :func:`cpu.backward`: bottom_grad as the logical NCHW view of a tensor stored in ``out_layout``.
    ``trusted_mapping``: mapping_channel is the forward's (autograd), so it needs no look. The rows of the
    gradient are split over the threads."""
    if top_grad.numel() == 0 or 0 in input_shape:  # nothing to add: the torch code returns the zeros
        return cpu.backward(top_grad, rois, mapping_channel, spatial_scale, output_dim, input_shape, out_layout,
                            trusted_mapping, convention)
    n, c, h, w = input_shape
    r, od, ph_n, pw_n = top_grad.shape
    groups = ph_n * pw_n
    canonical = trusted_mapping or _mapping_is_canonical(mapping_channel, c)
    rois_np, edges, area, _, acc, run, band_rows = _plan(rois, top_grad.dtype, ph_n, pw_n, spatial_scale, h, w, od,
                                                         convention)
    plane = band_rows * w * run
    dest = np.zeros(1, np.int64)
    if not canonical:  # each value's entry in a pixel's runs: its channel c at (c % K)*plane + c // K
        ch = mapping_channel.detach().permute(0, 2, 3, 1).reshape(-1).to(torch.int64)
        dest = numpy_alias(torch.remainder(ch, groups) * plane + torch.div(ch, groups, rounding_mode="floor"))
    bottom = empty_nchw((n, c, h, w), out_layout, like=top_grad)
    (top, ts), (b_flat, bs) = _dense(top_grad), _dense(bottom)
    diffs = np.empty(r * groups * run, acc)
    _split(_scaled_top, (top, ts, edges, ph_n, pw_n, od, run, diffs), even_parts(r, _threads(r * groups * od)), 1,
           acc)
    bands = -(-h // band_rows)
    threads = _threads(n * h * w * c + area * od)
    parts = even_parts(bands, BACKWARD_PARTS * threads if threads > 1 else 1)
    _split(_backward, (diffs, rois_np, edges, dest, canonical, ph_n, pw_n, od, run, n, h, w, band_rows, b_flat, bs),
           [(lo * band_rows, min(hi * band_rows, h)) for lo, hi in parts], groups * plane + c, acc)
    return bottom
