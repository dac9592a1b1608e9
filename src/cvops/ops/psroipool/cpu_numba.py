"""psroipool as fused numba loops: the CPU fast path when numba is installed (see ``_core/jit.py``).

Why: the doc's network cases move only 1-2 MB, less than the fixed cost of the ~35 eager ops of the
vectorised torch path (``cpu.py``), which therefore stays far below the IO-efficiency goal. One compiled
call per direction does the whole job here; ``cpu.py`` remains the fallback and the path for anything
this module does not take.

The loops are the reference's (``reference.py``): the same bin-edge arithmetic in the accumulation dtype
(float32, float64 for float64; one rounding per operation, no fastmath), and every bin summed pixel by
pixel in the same order. Results of these DIRECT kernels equal the reference's bit for bit, NaN/inf
included. The TABLE kernels (summed-area / difference tables, O(1) per bin, see below) agree within the
accumulating-op contract instead; ``METHOD`` (AUTO by default) picks per call the cheaper of the two.

* forward: one serial call. DIRECT is compiled per output_dim (first use of a new od compiles, ~1.5 s, then it
  is in numba's disk cache), so its od-long loops are fixed-length vector code; the used images are first
  regrouped to [N, H, W, K, od] (channel ctop*K + k at [k, ctop], 8 x 8 register transposes), so a bin pixel
  is one contiguous run of od values and the [R, PH, PW, od] output is written as runs of od. TABLE is one
  compilation per dtype: it regroups each pixel the same way straight into a float64 summed-area table and
  reads each bin's 4 corners 8 channels at a time, compiled with the SLP vectoriser on (numba leaves it off;
  without it those runs stay scalar). Measured on a quiet machine, the 2-thread variants lose badly at this
  size (a pool wake-up cost milliseconds: R-FCN g3 forward 32 ms, backwards 8 ms, against 0.2-0.3 ms serial).
* backward (the forward's mapping_channel): parallel over bands of rows; every element receives its
  contributions in RoI order, the reference's, so there are no races and every run gives the same bits.
  Any other mapping_channel: parallel over destination planes (batch, channel), same order.

Tensors reach the kernels as flat storage plus element strides of their logical NCHW view (dense NCHW or
NHWC storage), so each kernel compiles once per dtype whatever the layout; the hot loops use 2-D arrays.

What costs time in numba on these small cases (measured, serial): a view or a slice per RoI (~0.1 us each),
a scalar division (~0.6 ns, 10x a vectorised one), flat indexing with a computed offset (a negative-index
check per access, no vectorisation; ``a[row, loop_variable]`` on a C-contiguous 2-D array has neither),
libm floor/ceil calls, and short data-dependent loops (bins of 1-2 pixels: LLVM sets each one up for long
runs, ~5 ns per bin whatever the formulation tried). A computed row index that numba cannot prove
non-negative gets a fix-up per load, which also turns 8 neighbouring loads into a gather: unsigned indices
(``np.uint64``) avoid it.
"""
from __future__ import annotations

import functools
import threading

import numpy as np
import torch
from numba import prange

from ..._core.jit import match_torch_threads, njit, njit_variants, use_parallel
from ..._core.jit_intrinsics import compile_slp, transpose8
from ..._core.layout import empty_nchw
from ..._core.memory import new_empty
from . import checks

# which summation the kernels use: AUTO picks per call the cheaper of DIRECT (the reference's loops, bit-equal
# to it) and TABLE (summed-area / difference tables, O(1) per bin); tests pin one or the other
METHOD = 0  # AUTO (the constants are defined with the table kernels below)

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def supports(*tensors: torch.Tensor) -> bool:
    """CPU tensors of a dtype this path handles (floating inputs; index tensors are checked elsewhere)."""
    return all(t.device.type == "cpu" for t in tensors) and tensors[0].dtype in SUPPORTED


# ------------------------------------------------------------------------------------------- kernels
@njit(error_model="numpy")
def _round_half_away(v, dt):
    # trunc without a libm call: values of 2**52 and more (and inf/NaN) are already integral
    t = dt(int(v)) if abs(v) < dt(4503599627370496.0) else v
    if abs(v - t) >= dt(0.5):
        return t + dt(1.0) if v > 0 else t - dt(1.0)
    return t  # NaN and inf come back unchanged


@njit(error_model="numpy")
def _floor_index(v, limit):
    """``floor(v)`` clamped to [0, limit] (NaN gives 0), without a libm call: clamped first, truncation is
    the floor. Written as selects, not branches: random RoIs make branches here mispredict."""
    c = v if v > 0 else 0.0
    c = c if c < limit else limit
    return int(c)


@njit(error_model="numpy")
def _ceil_index(v, limit):
    """``ceil(v)`` clamped to [0, limit] (NaN gives 0), as :func:`_floor_index`."""
    c = v if v > 0 else 0.0
    c = c if c < limit else limit
    t = int(c)
    return t + 1 if c > t else t


@njit(error_model="numpy")
def _roi_edges(rois, i, ph_n, pw_n, scale, height, width, dt, edges):
    """edges[i, 0|1, p]: hs/he of bin row p; edges[i, 2|3, p]: ws/we of bin column p (R-FCN arithmetic in
    dt). Writes into the [R, 4, P] array itself: a view per RoI would cost more than the arithmetic."""
    start_w = _round_half_away(dt(rois[i, 1]), dt) * scale
    start_h = _round_half_away(dt(rois[i, 2]), dt) * scale
    end_w = (_round_half_away(dt(rois[i, 3]), dt) + dt(1.0)) * scale
    end_h = (_round_half_away(dt(rois[i, 4]), dt) + dt(1.0)) * scale
    roi_w = end_w - start_w
    roi_h = end_h - start_h
    if dt(0.1) > roi_w:  # at least 0.1 (NaN stays NaN)
        roi_w = dt(0.1)
    if dt(0.1) > roi_h:
        roi_h = dt(0.1)
    bin_h = roi_h / dt(ph_n)
    bin_w = roi_w / dt(pw_n)
    for p in range(ph_n):
        edges[i, 0, p] = _floor_index(dt(p) * bin_h + start_h, height)
        edges[i, 1, p] = _ceil_index(dt(p + 1) * bin_h + start_h, height)
    for p in range(pw_n):
        edges[i, 2, p] = _floor_index(dt(p) * bin_w + start_w, width)
        edges[i, 3, p] = _ceil_index(dt(p + 1) * bin_w + start_w, width)


@njit(error_model="numpy")
def _first_bad_batch(rois, batch):
    """Index of the first RoI whose int(batch index) is outside [0, batch), or -1."""
    for i in range(rois.shape[0]):
        b = rois[i, 0]
        if not (b > -1 and b < batch):
            return i
    return -1


@njit(error_model="numpy")
def _all_edges(rois, ph_n, pw_n, scale, height, width, dt):
    edges = np.empty((rois.shape[0], 4, max(ph_n, pw_n)), np.int64)
    for i in range(rois.shape[0]):
        _roi_edges(rois, i, ph_n, pw_n, scale, height, width, dt, edges)
    return edges


@njit(error_model="numpy")
def _bucket(keys, n_keys):
    """Stable counting sort: ``order[start[k]:start[k+1]]`` are the positions holding key k, ascending."""
    start = np.zeros(n_keys + 1, np.int64)
    for j in range(keys.shape[0]):
        if keys[j] >= 0:
            start[keys[j] + 1] += 1
    for k in range(n_keys):
        start[k + 1] += start[k]
    fill = start[:-1].copy()
    order = np.empty(start[n_keys], np.int64)
    for j in range(keys.shape[0]):
        if keys[j] >= 0:
            order[fill[keys[j]]] = j
            fill[keys[j]] += 1
    return order, start


@njit(error_model="numpy")
def _add_bin(bottom, plane, bs, hs, he, ws, we, diff):
    for y in range(hs, he):
        for xx in range(ws, we):
            bottom[plane + y * bs[2] + xx * bs[3]] += diff


@njit(error_model="numpy")
def _zero_plane(bottom, plane, bs, height, width):
    for y in range(height):
        for xx in range(width):
            bottom[plane + y * bs[2] + xx * bs[3]] = 0


@njit(error_model="numpy")
def _bin_diffs(edges, ph_n, pw_n, dt, grad, diffs):
    """``diffs[(i*PH + ph)*PW + pw, ctop] = grad[same] / area`` in dt (the reference's rounding) for every
    non-empty bin; ``grad``: top_grad as [R*PH*PW, od] rows, ``edges`` from :func:`_all_edges`."""
    od = grad.shape[1]
    for i in range(edges.shape[0]):
        for ph in range(ph_n):
            dh = edges[i, 1, ph] - edges[i, 0, ph]
            for pw in range(pw_n):
                area = dh * (edges[i, 3, pw] - edges[i, 2, pw])
                if area > 0:
                    a = dt(area)
                    row = (i * ph_n + ph) * pw_n + pw
                    for ctop in range(od):
                        diffs[row, ctop] = grad[row, ctop] / a


def _backward_canonical(edges, rois, ph_n, pw_n, grad, diffs, dt, bottom, bs, shape, acc, rows_nhwc):
    """mapping_channel is the forward's: channel ctop*K + k of image b gets bin k of channel ctop of every
    RoI of that image. grad: top_grad as [R*K, od] rows; diffs: scratch [R*K, od] that receives
    ``top_grad / area`` (the reference's rounding, :func:`_bin_diffs`, here to spare a call); bottom: flat dense
    [N, C, H, W] (strides bs); rows_nhwc: the same memory as [N*H*W, C] when it is NHWC storage (else unused);
    acc: scratch [N*H*W*K, od] of bottom's dtype.

    Each bin adds its od values to its pixels in ``acc`` (a pixel's K*od entries in one row each per bin,
    so one pixel loop serves all od channels), then acc is written out in the input's channel order
    (ctop*K + k). Two-dimensional arrays indexed ``[row, loop variable]`` let numba drop the negative-index
    checks and LLVM vectorise the short od loops (2-3x faster than flat indexing). Every element receives its
    contributions in RoI order, as in the reference, so the result is the reference's bit for bit. Tasks
    own disjoint bands of rows (each scans the RoIs in order), so results do not depend on the thread count.
    Returns -1 (the caller checked the batch indices)."""
    n, c, height, width = shape
    r = rois.shape[0]
    groups = ph_n * pw_n
    od = c // groups
    _bin_diffs(edges, ph_n, pw_n, dt, grad, diffs)
    nhwc = bs[1] == 1 and bs[3] == c
    per_image = _batch_counts(rois, n)
    acc_flat = acc.reshape(acc.shape[0] * od)
    source = np.empty(c, np.int64)  # input channel ctop*K + k sits at k*od + ctop of a pixel's acc entries
    for ch in range(c):
        source[ch] = (ch % groups) * od + ch // groups
    band = 4  # rows per task
    bands = (height + band - 1) // band
    for task in prange(n * bands):
        b, y0 = task // bands, (task % bands) * band
        y1 = min(y0 + band, height)
        if per_image[b] == 0:
            for y in range(y0, y1):
                for xx in range(width):
                    if nhwc:
                        p = (b * height + y) * width + xx
                        for ch in range(c):
                            rows_nhwc[p, ch] = 0
                    else:
                        pixel = b * bs[0] + y * bs[2] + xx * bs[3]
                        for ch in range(c):
                            bottom[pixel + ch * bs[1]] = 0
            continue
        for p in range(((b * height + y0) * width) * groups, ((b * height + y1) * width) * groups):
            for ctop in range(od):
                acc[p, ctop] = 0
        for i in range(r):
            if int(rois[i, 0]) != b:
                continue
            for ph in range(ph_n):
                hs, he = max(edges[i, 0, ph], y0), min(edges[i, 1, ph], y1)
                if he <= hs:
                    continue
                for pw in range(pw_n):
                    ws, we = edges[i, 2, pw], edges[i, 3, pw]
                    k = ph * pw_n + pw
                    d = i * groups + k
                    for y in range(hs, he):
                        for xx in range(ws, we):
                            at = ((b * height + y) * width + xx) * groups + k
                            for ctop in range(od):
                                acc[at, ctop] += diffs[d, ctop]
        for y in range(y0, y1):
            for xx in range(width):
                p = (b * height + y) * width + xx
                if nhwc:  # contiguous writes, reads through the channel permutation
                    at = p * c
                    for ch in range(c):
                        rows_nhwc[p, ch] = acc_flat[at + source[ch]]
                else:
                    pixel = b * bs[0] + y * bs[2] + xx * bs[3]
                    for k in range(groups):
                        for ctop in range(od):
                            bottom[pixel + (ctop * groups + k) * bs[1]] = acc[p * groups + k, ctop]
    return -1


def _backward_any(g, gs, top_shape, rois, mapping, ms, scale, bottom, bs, shape, dt):
    """Any in-range mapping_channel: contributions bucketed by destination plane (batch, channel) in the
    reference's order (RoI, ctop, ph, pw), then each plane sums its bucket."""
    bad = _first_bad_batch(rois, shape[0])
    if bad >= 0:
        return bad
    r, od, ph_n, pw_n = top_shape
    n, c, height, width = shape
    edges = _all_edges(rois, ph_n, pw_n, scale, height, width, dt)
    per_roi = od * ph_n * pw_n
    keys = np.empty(r * per_roi, np.int64)
    for i in prange(r):
        b = int(rois[i, 0])
        for ctop in range(od):
            for ph in range(ph_n):
                for pw in range(pw_n):
                    chan = mapping[i * ms[0] + ctop * ms[1] + ph * ms[2] + pw * ms[3]]
                    keys[((i * od + ctop) * ph_n + ph) * pw_n + pw] = b * c + chan
    order, start = _bucket(keys, n * c)
    for key in prange(n * c):
        plane = (key // c) * bs[0] + (key % c) * bs[1]
        _zero_plane(bottom, plane, bs, height, width)
        for j in range(start[key], start[key + 1]):
            e = order[j]
            i, rest = e // per_roi, e % per_roi
            ctop, k = rest // (ph_n * pw_n), rest % (ph_n * pw_n)
            ph, pw = k // pw_n, k % pw_n
            hs, he, ws, we = edges[i, 0, ph], edges[i, 1, ph], edges[i, 2, pw], edges[i, 3, pw]
            if he > hs and we > ws:
                diff = g[i * gs[0] + ctop * gs[1] + ph * gs[2] + pw * gs[3]] / dt((he - hs) * (we - ws))
                _add_bin(bottom, plane, bs, hs, he, ws, we, diff)
    return -1


@njit(error_model="numpy")
def _count_foreign(mapping, ms, top_shape):
    """How many mapping_channel entries differ from the forward's ``(ctop*PH + ph)*PW + pw``. ``mapping`` is
    dense (NCHW or NHWC storage), so every RoI's block is one contiguous run: compared against a template in
    storage order, in one long (vectorised) loop."""
    r, od, ph_n, pw_n = top_shape
    groups = ph_n * pw_n
    block = od * groups
    template = np.empty(block, mapping.dtype)
    for ctop in range(od):
        for k in range(groups):
            template[ctop * ms[1] + (k // pw_n) * ms[2] + (k % pw_n) * ms[3]] = ctop * groups + k
    foreign = 0
    for i in range(r):
        for e in range(block):
            foreign += mapping[i * block + e] != template[e]
    return foreign


# ------------------------------------------------------------------------ summed-area tables (O(1) per bin)
# Direct summation costs a bin's area per output; these kernels cost O(1) per bin after one pass over the
# planes the RoIs use. Tables are float64 (exact for typical float32 data, ~1e-16 relative otherwise) and
# each result is rounded once to the accumulation dtype, so they agree with the reference within the
# accumulating-op contract (diff1, diff2 <= 3e-3; ~1e-7 in float32), not bit for bit. Planes whose table
# is not finite (NaN/inf inputs, float64 overflow) are summed directly as the reference does, so NaN/inf
# land exactly where the reference puts them.
AUTO, DIRECT, TABLE = 0, 1, 2
USE_DIRECT = -3  # kernel return code: direct summation is cheaper (or needed); run the direct kernel


@njit(error_model="numpy")
def _batch_counts(rois, n):
    counts = np.zeros(n, np.int64)
    for i in range(rois.shape[0]):
        counts[int(rois[i, 0])] += 1
    return counts


@njit(error_model="numpy")
def _summed_area(edges, r, ph_n, pw_n):
    """Sum over RoIs of their bins' areas (the pixels direct summation visits per output channel)."""
    total = 0
    for i in range(r):
        rows = 0
        for p in range(ph_n):
            rows += max(edges[i, 1, p] - edges[i, 0, p], 0)
        cols = 0
        for p in range(pw_n):
            cols += max(edges[i, 3, p] - edges[i, 2, p], 0)
        total += rows * cols
    return total


@njit(error_model="numpy")
def _backward_table_pays(summed_area, bins, od, table_entries):
    """Whether the difference tables beat the direct scatter (backward): three passes over the tables (zero,
    corners, prefix) plus the corner updates, ~1.2 ns per unit, against ~0.5 ns per bin pixel and channel for
    the direct scatter (measured on the doc's cases, serial)."""
    return 2 * od * summed_area > 5 * (3 * table_entries + 2 * bins * od)


@njit(error_model="numpy")
def _backward_plan(rois, n, c, ph_n, pw_n, scale, height, width, dt):
    """(bin edges, whether the difference tables pay) in one call: each numba call costs ~1-2 us."""
    edges = _all_edges(rois, ph_n, pw_n, scale, height, width, dt)
    counts = _batch_counts(rois, n)
    used = 0
    for b in range(n):
        used += counts[b] > 0
    r = rois.shape[0]
    return edges, _backward_table_pays(_summed_area(edges, r, ph_n, pw_n), r * ph_n * pw_n, c // (ph_n * pw_n),
                                       used * c * (height + 1) * (width + 1))


def _backward_table_kernel(g, gs, top_shape, rois, scale, bottom, bs, shape, dt, method):
    """Canonical mapping_channel (see :func:`_backward_canonical`). One task per (image, ctop) owns the K
    channels ctop*K .. ctop*K+K-1 of that image: a float64 difference table (+v/-v at the 4 corners of every
    bin, v = top_grad/area, the image's RoIs in index order), a 2-D prefix sum, and an int coverage count by
    the same corner trick so pixels under no bin with a nonzero v stay exactly 0. Tasks own disjoint
    channels: no races, fixed order, same bits every run. Returns the first bad RoI, -1 when done, or
    USE_DIRECT (a non-finite top_grad, or direct is cheaper; what was written is to be overwritten)."""
    bad = _first_bad_batch(rois, shape[0])
    if bad >= 0:
        return bad
    r, od, ph_n, pw_n = top_shape
    n, c, height, width = shape
    groups = ph_n * pw_n
    edges = _all_edges(rois, ph_n, pw_n, scale, height, width, dt)
    keys = np.empty(r, np.int64)
    for i in range(r):
        keys[i] = int(rois[i, 0])
    order, start = _bucket(keys, n)
    used = 0
    for b in range(n):
        used += start[b + 1] > start[b]
    if method == AUTO and not _backward_table_pays(_summed_area(edges, r, ph_n, pw_n), r * groups, od,
                                                   used * c * (height + 1) * (width + 1)):
        return USE_DIRECT
    for i in range(r):  # NaN/inf gradients: the direct scatter propagates them as the reference does
        for ctop in range(od):
            for ph in range(ph_n):
                for pw in range(pw_n):
                    v = g[i * gs[0] + ctop * gs[1] + ph * gs[2] + pw * gs[3]]
                    if not (v - v == 0):
                        return USE_DIRECT
    row = (width + 1) * groups
    size = (height + 1) * row
    failed = np.zeros(n * od, np.bool_)
    for task in prange(n * od):
        b, ctop = task // od, task % od
        first = b * bs[0] + ctop * groups * bs[1]
        if start[b + 1] == start[b]:
            for k in range(groups):
                _zero_plane(bottom, first + k * bs[1], bs, height, width)
            continue
        diffs = np.zeros(size, np.float64)
        cover = np.zeros(size, np.int32)
        for j in range(start[b], start[b + 1]):
            i = order[j]
            for ph in range(ph_n):
                hs, he = edges[i, 0, ph], edges[i, 1, ph]
                if he <= hs:
                    continue
                for pw in range(pw_n):
                    ws, we = edges[i, 2, pw], edges[i, 3, pw]
                    if we <= ws:
                        continue
                    v = np.float64(g[i * gs[0] + ctop * gs[1] + ph * gs[2] + pw * gs[3]]) \
                        / np.float64((he - hs) * (we - ws))
                    if v == 0:
                        continue
                    k = ph * pw_n + pw
                    diffs[hs * row + ws * groups + k] += v
                    diffs[hs * row + we * groups + k] -= v
                    diffs[he * row + ws * groups + k] -= v
                    diffs[he * row + we * groups + k] += v
                    cover[hs * row + ws * groups + k] += 1
                    cover[hs * row + we * groups + k] -= 1
                    cover[he * row + ws * groups + k] -= 1
                    cover[he * row + we * groups + k] += 1
        running = np.empty(groups, np.float64)
        running_cover = np.empty(groups, np.int32)
        for y in range(height):
            running[:] = 0
            running_cover[:] = 0
            for xx in range(width):
                at = y * row + xx * groups
                pixel = first + y * bs[2] + xx * bs[3]
                for k in range(groups):
                    running[k] += diffs[at + k]
                    running_cover[k] += cover[at + k]
                    total = running[k] + (diffs[at - row + k] if y > 0 else 0.0)
                    covered = running_cover[k] + (cover[at - row + k] if y > 0 else 0)
                    diffs[at + k] = total
                    cover[at + k] = covered
                    bottom[pixel + k * bs[1]] = total if covered > 0 else 0.0
                    if covered > 0 and not (total - total == 0):
                        failed[task] = True  # float64 overflow (float64 gradients near the limit)
    for task in range(n * od):
        if failed[task]:
            return USE_DIRECT
    return -1


@njit(error_model="numpy")
def _grouped_table_pays(pixel_reads, table_entries):
    """Whether the summed-area table beats the grouped direct forward: ~0.3 ns per bin pixel and channel
    against ~1 ns per table entry (both pay the same per-output work). Measured on the doc's cases, serial,
    whole ``forward`` call: R-FCN g7 direct 155 us vs table 165 us, g3 166 vs 145; the rule picks the faster."""
    return 8 * pixel_reads > 25 * table_entries


_LANES = 8  # channels per vector step of the table kernels (transpose8's block, one 256-bit f32 / 2 f64 registers)
_U1, _U2, _U3, _U4, _U5, _U6, _U7 = (np.uint64(j) for j in range(1, _LANES))  # unsigned lane offsets


@njit(error_model="numpy")
def _regroup_pixel(x, at, od, groups, line, line_at):
    """``line[line_at + k*od + ctop] = x[at + ctop*groups + k]`` (in line's dtype): one pixel's channels
    regrouped so each bin's od values are one run. 8 x 8 register transposes; the last block of each axis
    overlaps the one before instead of needing a remainder loop (it rewrites the same values). Short axes
    take the scalar loop."""
    if od >= _LANES and groups >= _LANES:
        for a in range(0, od, _LANES):
            a0 = min(a, od - _LANES)
            for kb in range(0, groups, _LANES):
                k0 = min(kb, groups - _LANES)
                transpose8(x, at + a0 * groups + k0, groups, line, line_at + k0 * od + a0, od)
    else:
        for ctop in range(od):
            for k in range(groups):
                line[line_at + k * od + ctop] = x[at + ctop * groups + k]


@njit(error_model="numpy")
def _bin_lanes(table, hi_e, hi_s, lo_e, lo_s, col, inv_area, out, top, c0):
    """``out[top, c0 + j] = ((T[hi_e] - T[hi_s]) - (T[lo_e] - T[lo_s]))[col + j] * inv_area`` for j < 8.

    Written out lane by lane, every load before the first store, so the SLP vectoriser (``compile_slp``)
    emits vector code; indices are unsigned so numba adds no negative-index fix-ups that would stop it.
    The row differences are exactly +0 for an empty bin (both corners the same), so empty bins give +0."""
    t0 = (table[hi_e, col] - table[hi_s, col]) - (table[lo_e, col] - table[lo_s, col])
    t1 = (table[hi_e, col + _U1] - table[hi_s, col + _U1]) - (table[lo_e, col + _U1] - table[lo_s, col + _U1])
    t2 = (table[hi_e, col + _U2] - table[hi_s, col + _U2]) - (table[lo_e, col + _U2] - table[lo_s, col + _U2])
    t3 = (table[hi_e, col + _U3] - table[hi_s, col + _U3]) - (table[lo_e, col + _U3] - table[lo_s, col + _U3])
    t4 = (table[hi_e, col + _U4] - table[hi_s, col + _U4]) - (table[lo_e, col + _U4] - table[lo_s, col + _U4])
    t5 = (table[hi_e, col + _U5] - table[hi_s, col + _U5]) - (table[lo_e, col + _U5] - table[lo_s, col + _U5])
    t6 = (table[hi_e, col + _U6] - table[hi_s, col + _U6]) - (table[lo_e, col + _U6] - table[lo_s, col + _U6])
    t7 = (table[hi_e, col + _U7] - table[hi_s, col + _U7]) - (table[lo_e, col + _U7] - table[lo_s, col + _U7])
    out[top, c0] = t0 * inv_area
    out[top, c0 + _U1] = t1 * inv_area
    out[top, c0 + _U2] = t2 * inv_area
    out[top, c0 + _U3] = t3 * inv_area
    out[top, c0 + _U4] = t4 * inv_area
    out[top, c0 + _U5] = t5 * inv_area
    out[top, c0 + _U6] = t6 * inv_area
    out[top, c0 + _U7] = t7 * inv_area


def _table_forward(x, rois, edges, per_image, ph_n, pw_n, height, width, out, mapping, template, table, line, dt):
    """The summed-area-table forward for any output_dim (one compilation per dtype).

    x: input storage as flat NHWC [N*H*W*C] (acc dtype); out: [R*K, od] NHWC rows (acc dtype); mapping: [R, K*od]
    rows (storage order) filled from ``template``; table: float64 scratch [N*(H+1)*(W+1), K*od]; line: float64
    scratch [K*od]. Per used image, each pixel is regrouped (:func:`_regroup_pixel`) and integrated into the
    table; each bin is then 4 corner rows (:func:`_bin_lanes`; od < 8 takes a scalar loop). Planes whose table
    is not finite (NaN/inf inputs, float64 overflow) are summed directly in the reference's order.
    ``edges``/``per_image`` come from :func:`_forward_plan` (batch indices already checked)."""
    groups = ph_n * pw_n
    kod = template.shape[0]
    od = kod // groups
    n = per_image.shape[0]
    r = rois.shape[0]
    wide = width + 1
    image_bad = np.zeros(n, np.bool_)
    plane_bad = np.zeros((n, kod), np.bool_)
    running = np.empty(kod, np.float64)
    for b in range(n):
        if per_image[b] == 0:
            continue
        img = b * (height + 1) * wide
        for at in range(img, img + wide):  # top border
            for j in range(kod):
                table[at, j] = 0
        for y in range(height):
            running[:] = 0
            above = img + y * wide
            here = above + wide
            for j in range(kod):  # left border
                table[here, j] = 0
            for xx in range(width):
                _regroup_pixel(x, ((b * height + y) * width + xx) * kod, od, groups, line, 0)
                for j in range(kod):
                    running[j] += line[j]
                    table[here + xx + 1, j] = table[above + xx + 1, j] + running[j]
        corner = img + height * wide + width
        for j in range(kod):
            v = table[corner, j]
            if not (v - v == 0):  # NaN or inf somewhere in the plane
                plane_bad[b, j] = True
                image_bad[b] = True
    inverse = np.empty(height * width + 1, np.float64)  # 1/area by lookup: a division per bin is slow
    inverse[0] = 0.0
    for a in range(1, height * width + 1):
        inverse[a] = 1.0 / np.float64(a)
    u_od = np.uint64(od)
    last = np.uint64(od - _LANES) if od >= _LANES else np.uint64(0)
    for i in range(r):
        for e in range(kod):
            mapping[i, e] = template[e]
        b = int(rois[i, 0])
        img = b * (height + 1) * wide
        for ph in range(ph_n):
            hs, he = edges[i, 0, ph], edges[i, 1, ph]
            lo, hi = img + hs * wide, img + he * wide
            for pw in range(pw_n):
                ws, we = edges[i, 2, pw], edges[i, 3, pw]
                k = ph * pw_n + pw
                top = np.uint64(i * groups + k)
                inv_area = inverse[np.uint64((he - hs) * (we - ws))]
                hi_e, hi_s, lo_e, lo_s = np.uint64(hi + we), np.uint64(hi + ws), np.uint64(lo + we), np.uint64(lo + ws)
                col = np.uint64(k) * u_od
                if od == _LANES:  # one block: no loop (the common R-FCN g7 shape)
                    _bin_lanes(table, hi_e, hi_s, lo_e, lo_s, col, inv_area, out, top, np.uint64(0))
                elif od > _LANES:
                    for c0 in range(0, od, _LANES):
                        u0 = min(np.uint64(c0), last)
                        _bin_lanes(table, hi_e, hi_s, lo_e, lo_s, col + u0, inv_area, out, top, u0)
                else:
                    for ctop in range(od):
                        j = col + np.uint64(ctop)
                        out[top, ctop] = ((table[hi_e, j] - table[hi_s, j])
                                          - (table[lo_e, j] - table[lo_s, j])) * inv_area
                if image_bad[b]:
                    for ctop in range(od):
                        if plane_bad[b, k * od + ctop]:  # the reference's own loop and rounding
                            acc = dt(0.0)
                            for y in range(hs, he):
                                for xx in range(ws, we):
                                    acc += x[((b * height + y) * width + xx) * kod + ctop * groups + k]
                            area = (he - hs) * (we - ws)
                            out[top, ctop] = acc / dt(area) if area > 0 else dt(0.0)


_TABLE_FORWARD = njit(_table_forward, error_model="numpy")


@njit(error_model="numpy")
def _forward_plan(rois, n, od, ph_n, pw_n, scale, height, width, dt, method):
    """(first bad RoI or -1, bin edges, RoIs per image, whether to use the table) in one call: each numba call
    costs microseconds, a visible share of the doc's cases."""
    bad = _first_bad_batch(rois, n)
    edges = _all_edges(rois, ph_n, pw_n, scale, height, width, dt)
    if bad >= 0:
        return bad, edges, np.zeros(n, np.int64), False
    per_image = _batch_counts(rois, n)
    use_table = method == TABLE
    if method == AUTO:
        used = 0
        for b in range(n):
            used += per_image[b] > 0
        use_table = _grouped_table_pays(_summed_area(edges, rois.shape[0], ph_n, pw_n) * od,
                                        used * od * ph_n * pw_n * (height + 1) * (width + 1))
    return -1, edges, per_image, use_table


_GROUPED = {}  # output_dim -> compiled grouped forward


def _grouped_forward(od: int):
    """The direct forward compiled for one ``output_dim``: with od known at compile time the od-long loops are
    straight vector code (measured ~2x faster than a runtime od on the doc's cases). numba keys its disk
    cache on the closure's values too, so every od gets its own entry (~1.5 s to compile, once)."""
    kernel = _GROUPED.get(od)
    if kernel is not None:
        return kernel
    OD = od

    def grouped_forward(x, xr, rois, edges, per_image, ph_n, pw_n, height, width, out, mapping, template, dt):
        """x: input storage as flat NHWC [N*H*W*C]; xr: scratch [N*H*W*K*OD] (acc dtype) that receives the
        input regrouped so that channel ctop*K + k sits at [.., k*OD + ctop] (one contiguous run of OD per
        pixel and bin); out: [R*K, OD] NHWC rows; mapping: [R, K*OD] rows (storage order); template: one
        RoI's mapping row; edges/per_image from :func:`_forward_plan`.

        Sums every bin pixel by pixel, rows then columns, from 0, as the reference: the same bits."""
        n = per_image.shape[0]
        groups = ph_n * pw_n
        kod = groups * OD
        for b in range(n):  # images no RoI reads are not regrouped
            if per_image[b] == 0:
                continue
            for p in range(b * height * width, (b + 1) * height * width):
                _regroup_pixel(x, p * kod, OD, groups, xr, p * kod)
        cells = xr.reshape(n * height * width * groups, OD)
        r = rois.shape[0]
        for i in range(r):
            for e in range(kod):
                mapping[i, e] = template[e]
        for i in range(r):
            b = int(rois[i, 0])
            for ph in range(ph_n):
                hs, he = edges[i, 0, ph], edges[i, 1, ph]
                for pw in range(pw_n):
                    ws, we = edges[i, 2, pw], edges[i, 3, pw]
                    k = ph * pw_n + pw
                    top = i * groups + k
                    for ctop in range(OD):
                        out[top, ctop] = 0
                    if he <= hs or we <= ws:
                        continue  # empty bins stay 0
                    for y in range(hs, he):
                        for xx in range(ws, we):
                            cell = ((b * height + y) * width + xx) * groups + k
                            for ctop in range(OD):
                                out[top, ctop] += cells[cell, ctop]
                    area = dt((he - hs) * (we - ws))
                    for ctop in range(OD):
                        out[top, ctop] /= area
        return -1

    grouped_forward.__qualname__ = f"grouped_forward_od{od}"
    kernel = _GROUPED[od] = njit(grouped_forward, error_model="numpy")
    return kernel


_BACKWARD_TABLE = njit_variants(_backward_table_kernel, error_model="numpy")
_BACKWARD_CANONICAL = njit_variants(_backward_canonical, error_model="numpy")
_BACKWARD_ANY = njit_variants(_backward_any, error_model="numpy")


def _variant(kernels, work: float):
    """The parallel compilation for calls of milliseconds and more, else the serial one."""
    if use_parallel(work):
        match_torch_threads()
        return kernels[1]
    return kernels[0]


# ------------------------------------------------------------------------------------------- wrappers
def _flat(t: torch.Tensor):
    """(flat numpy view of the storage, element strides) of a 4-D tensor, densified if it is neither NCHW-
    nor NHWC-dense. Returns the (possibly new) tensor too, to keep it alive and to copy results back."""
    if not (t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)):
        t = t.contiguous()
    flat = t.detach().as_strided((t.numel(),), (1,)).numpy()
    return t, flat, tuple(t.stride())


_SCRATCH = threading.local()
SCRATCH_KEEP_BYTES = 8 << 20  # per-thread work buffers up to this size are kept between calls


def _scratch(name: str, shape, dtype=np.float64) -> np.ndarray:
    """A work buffer of ``shape`` and ``dtype`` (contiguous), kept per thread and name: a fresh one would be
    mapped and page-faulted in on every call (tens of microseconds for the network cases' tables). Buffers
    over ``SCRATCH_KEEP_BYTES`` come from the shared recycler instead (capped, released by empty_cache)."""
    size = 1
    for s in shape:
        size *= int(s)
    if size * np.dtype(dtype).itemsize > SCRATCH_KEEP_BYTES:
        torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
        return new_empty((size,), torch_dtype).numpy().reshape(shape)
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None:
        buffers = _SCRATCH.buffers = {}
    buf = buffers.get((name, dtype))
    if buf is None or buf.shape[0] < size:
        buf = buffers[(name, dtype)] = np.empty(max(size, 1), dtype)
    return buf[:size].reshape(shape)


def _np_dtype(acc: torch.dtype):
    return np.float64 if acc == torch.float64 else np.float32


def _acc_target(out: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """Where the kernel writes: ``out`` itself when it has the accumulation dtype, else an acc twin (same
    layout); the caller copies back (one rounding, as the reference)."""
    return out if out.dtype == acc else torch.empty_like(out, dtype=acc)


def _rois64(rois: torch.Tensor) -> np.ndarray:
    return rois.detach().to(torch.float64).contiguous().numpy()


@functools.lru_cache(maxsize=64)
def _mapping_template(od: int, ph_n: int, pw_n: int, ms) -> np.ndarray:
    """One RoI's mapping_channel (channel ``ctop*K + k``) in the storage order given by the strides ``ms``."""
    groups = ph_n * pw_n
    template = np.empty(od * groups, np.int32)
    for ctop in range(od):
        for k in range(groups):
            template[ctop * ms[1] + (k // pw_n) * ms[2] + (k % pw_n) * ms[3]] = ctop * groups + k
    return template


def _call_table_forward(args, dt) -> None:
    """The table kernel, compiled with the SLP vectoriser on (:func:`compile_slp`) on first use per
    accumulation dtype: :func:`forward` builds every other argument the same way (C-contiguous arrays,
    ints), so ``dt`` alone tells the signatures apart, and the per-call check stays one set lookup."""
    if dt not in _SLP_COMPILED:
        import numba
        compile_slp(_TABLE_FORWARD, tuple(numba.typeof(a) for a in args))
        _SLP_COMPILED.add(dt)
    _TABLE_FORWARD(*args)


_SLP_COMPILED = set()  # accumulation dtypes whose table kernel was compiled with SLP


def forward(input, rois, pooled_height, pooled_width, spatial_scale, output_dim, out_layout="NCHW"):
    """As :func:`cpu.forward`; the caller checked ``supports`` and non-empty tensors."""
    n, c, h, w = input.shape
    r = rois.shape[0]
    groups = pooled_height * pooled_width
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    dt = _np_dtype(acc)
    x = input.detach()
    x = x if x.dtype == acc else x.to(acc)
    x_flat = x.permute(0, 2, 3, 1).reshape(n * h * w * c).numpy()  # NHWC storage (a copy for NCHW input)
    shape = (r, output_dim, pooled_height, pooled_width)
    output = empty_nchw(shape, out_layout, like=input)
    mapping = empty_nchw(shape, out_layout, like=input.new_empty(0, dtype=torch.int32))
    # the kernels write [R*PH*PW, od] rows: the output's own storage when it is NHWC in the acc dtype
    nhwc = out_layout == "NHWC"
    in_place = nhwc and output.dtype == acc
    rows = output.permute(0, 2, 3, 1).numpy().reshape(r * groups, output_dim) if in_place \
        else _scratch("rows", (r * groups, output_dim), dt)
    map_rows = (mapping.permute(0, 2, 3, 1) if nhwc else mapping).numpy().reshape(r, output_dim * groups)
    template = _mapping_template(output_dim, pooled_height, pooled_width, tuple(mapping.stride()))
    rois64 = _rois64(rois)
    bad, edges, per_image, use_table = _forward_plan(rois64, n, output_dim, pooled_height, pooled_width,
                                                     dt(spatial_scale), h, w, dt, METHOD)
    if bad >= 0:
        checks.check_batch_indices(checks.OP, rois, n)  # raises, naming the RoI
    if use_table:
        _call_table_forward((x_flat, rois64, edges, per_image, pooled_height, pooled_width, h, w, rows, map_rows,
                             template, _scratch("table", (n * (h + 1) * (w + 1), c)), _scratch("line", (c,)), dt), dt)
    else:
        _grouped_forward(output_dim)(x_flat, _scratch("grouped", (n * h * w * c,), dt), rois64, edges, per_image,
                                     pooled_height, pooled_width, h, w, rows, map_rows, template, dt)
    if not in_place:  # one rounding to the output dtype, as the reference
        output.copy_(torch.from_numpy(rows).view(r, pooled_height, pooled_width, output_dim).permute(0, 3, 1, 2))
    return output, mapping


def _backward_direct(top_grad, edges, rois64, scale, b_flat, b_strides, shape, dt, work):
    """The direct backward for the forward's mapping_channel: ``top_grad / area`` per bin, then the scatter."""
    r, od, ph_n, pw_n = top_grad.shape
    n, c, h, w = shape
    grad = top_grad.permute(0, 2, 3, 1)  # [R, PH, PW, od]
    if not grad.is_contiguous():
        grad = grad.contiguous()
    diffs = _scratch("diffs", (r * ph_n * pw_n, od), dt)
    acc = _scratch("acc", (n * h * w * ph_n * pw_n, od), dt)
    return _variant(_BACKWARD_CANONICAL, work)(edges, rois64, ph_n, pw_n, grad.numpy().reshape(r * ph_n * pw_n, od),
                                               diffs, dt, b_flat, b_strides, shape, acc, b_flat.reshape(n * h * w, c))


def backward(top_grad, rois, mapping_channel, spatial_scale, output_dim, input_shape, out_layout="NCHW",
             trusted_mapping=False):
    """As :func:`cpu.backward`; the caller checked ``supports`` and non-empty tensors."""
    n, c, h, w = input_shape
    acc = torch.float64 if top_grad.dtype == torch.float64 else torch.float32
    dt = _np_dtype(acc)
    g, g_flat, g_strides = _flat(top_grad if top_grad.dtype == acc else top_grad.to(acc))
    bottom = empty_nchw((n, c, h, w), out_layout, like=top_grad)
    target = _acc_target(bottom, acc)
    _, b_flat, b_strides = _flat(target)
    rois64 = _rois64(rois)
    top_shape = tuple(top_grad.shape)
    work = top_grad.numel() // (top_shape[2] * top_shape[3]) * h * w + bottom.numel()  # as forward + zeroing
    canonical = trusted_mapping
    if not canonical:
        _, m_flat, m_strides = _flat(mapping_channel)
        canonical = _count_foreign(m_flat, m_strides, top_shape) == 0
    scale = dt(spatial_scale)
    if canonical:
        bad = _first_bad_batch(rois64, n)
        if bad < 0:
            r, od, ph_n, pw_n = top_shape
            edges, table_pays = _backward_plan(rois64, n, c, ph_n, pw_n, scale, h, w, dt)
            use_table = METHOD == TABLE or (METHOD == AUTO and table_pays)
            bad = USE_DIRECT
            if use_table:  # still USE_DIRECT for non-finite gradients
                bad = _variant(_BACKWARD_TABLE, 3 * bottom.numel() + 8 * top_grad.numel())(
                    g_flat, g_strides, top_shape, rois64, scale, b_flat, b_strides, (n, c, h, w), dt, TABLE)
            if bad == USE_DIRECT:
                bad = _backward_direct(g, edges, rois64, scale, b_flat, b_strides, (n, c, h, w), dt, work)
    else:
        checks.check_mapping_values(checks.OP_BACKWARD, mapping_channel, c)
        kernel = _variant(_BACKWARD_ANY, work)
        bad = kernel(g_flat, g_strides, top_shape, rois64, m_flat, m_strides, scale, b_flat, b_strides, (n, c, h, w),
                     dt)
    if bad >= 0:
        checks.check_batch_indices(checks.OP_BACKWARD, rois, n)  # raises, naming the RoI
    if target is not bottom:
        bottom.copy_(target)
    return bottom
