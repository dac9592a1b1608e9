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

* both directions first compute every bin edge in one vectorised pass (RoI-inner loops, int32 [4, P, R]) in a
  "plan" call that also checks the batch indices and makes the AUTO choice from a cost model fitted to the
  kernels (``_grouped_table_pays`` / ``_backward_table_pays``): few RoIs on a large image go DIRECT, the doc's
  network cases go TABLE.
* forward: one serial call. DIRECT is compiled per output_dim (first use of a new od compiles, ~1.5 s, then it
  is in numba's disk cache), so its od-long loops are fixed-length vector code; the used images are first
  regrouped to [N, H, W, K, od] (channel ctop*K + k at [k, ctop], 8 x 8 register transposes), so a bin pixel
  is one contiguous run of od values and the [R, PH, PW, od] output is written as runs of od. TABLE regroups
  each pixel the same way straight into a float64 summed-area table, its runs padded to whole cache lines, and
  reads each bin's 4 corners 8 channels at a time, compiled with the SLP vectoriser on (numba leaves it off;
  without it those runs stay scalar); it is compiled per padded od (see :func:`_table_forward_for`). Two threads
  do not pay at this size on the 2-core CI machine: waking numba's pool costs ~1 us, but a 0.8 MB streaming loop
  took 30 us on two threads against 16 us on one (an earlier measurement saw millisecond wake-ups).
* backward, the forward's mapping_channel: TABLE (serial, compiled per od) adds each bin's ``top_grad / area`` at
  the 4 corners of a float64 difference table, 8 channels at a time (SLP), and one prefix sum per image yields the
  gradient, written out through register transposes. DIRECT scatters bin by bin, parallel over bands of rows; every
  element receives its contributions in RoI order, the reference's, so there are no races and every run gives
  the same bits. Any other mapping_channel: parallel over destination planes (batch, channel), same order.

Tensors reach the kernels as flat storage plus element strides of their logical NCHW view (dense NCHW or
NHWC storage), so each kernel compiles once per dtype whatever the layout; the table kernels take NHWC rows.

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
from ..._core.layout import as_nchw
from ..._core.memory import new_empty
from . import checks

# which summation the kernels use: AUTO picks per call the cheaper of DIRECT (the reference's loops, bit-equal
# to it) and TABLE (summed-area / difference tables, O(1) per bin); tests pin one or the other
METHOD = 0  # AUTO (the constants are defined with the table kernels below)

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def supports(*tensors: torch.Tensor) -> bool:
    """CPU tensors of a dtype this path handles (floating inputs; index tensors are checked elsewhere)."""
    for t in tensors:
        if not t.is_cpu:
            return False
    return tensors[0].dtype in SUPPORTED


# ------------------------------------------------------------------------------------------- kernels
@njit(error_model="numpy")
def _round_half_away(v, dt):
    # trunc without a libm call: values of 2**52 and more (and inf/NaN) are already integral
    t = dt(int(v)) if abs(v) < dt(4503599627370496.0) else v
    if abs(v - t) >= dt(0.5):
        return t + dt(1.0) if v > 0 else t - dt(1.0)
    return t  # NaN and inf come back unchanged


@njit(error_model="numpy")
def _axis_edges(starts, a, bins, limit, edges, e):
    """``edges[e, p, i] = floor(p*size + start)`` and ``edges[e+1, p, i] = ceil((p+1)*size + start)``, clamped to
    [0, limit] (NaN gives 0), for every RoI i; start/size are ``starts[a, i]`` / ``starts[a+1, i]``. The clamps
    are selects and truncation of the clamped value is the floor (no libm call, no branch), and the RoI loop is
    innermost, so the whole pass is vector code (~1 us for the doc's cases; a RoI at a time took ~14 us)."""
    dt = starts.dtype.type
    zero = dt(0.0)
    for p in range(bins):
        lo, hi = dt(p), dt(p + 1)
        for i in range(starts.shape[1]):
            v = lo * starts[a + 1, i] + starts[a, i]
            v = v if v > zero else zero
            v = v if v < limit else limit
            edges[e, p, i] = np.int32(v)
            v = hi * starts[a + 1, i] + starts[a, i]
            v = v if v > zero else zero
            v = v if v < limit else limit
            t = np.int32(v)
            edges[e + 1, p, i] = t + np.int32(v > dt(t))


@njit(error_model="numpy")
def _bin_edges(rois, ph_n, pw_n, scale, height, width, starts, edges):
    """Bin edges of every RoI (R-FCN arithmetic in the dtype of ``starts``, one rounding per operation):
    ``edges[0|1, p, i]`` = hs/he of bin row p of RoI i, ``edges[2|3, p, i]`` = ws/we of bin column p (int32
    [4, max(PH, PW), R]). ``starts``: scratch [4, R] of the accumulation dtype (bin starts and sizes)."""
    dt = starts.dtype.type
    for i in range(rois.shape[0]):
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
        starts[0, i] = start_h
        starts[1, i] = roi_h / dt(ph_n)
        starts[2, i] = start_w
        starts[3, i] = roi_w / dt(pw_n)
    _axis_edges(starts, 0, ph_n, dt(height), edges, 0)
    _axis_edges(starts, 2, pw_n, dt(width), edges, 2)


@njit(error_model="numpy")
def _first_bad_batch(rois, batch):
    """Index of the first RoI whose int(batch index) is outside [0, batch), or -1."""
    for i in range(rois.shape[0]):
        b = rois[i, 0]
        if not (b > -1 and b < batch):
            return i
    return -1


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
def _bin_diffs(edges, ph_n, pw_n, grad, diffs):
    """``diffs[(i*PH + ph)*PW + pw, ctop] = grad[same] / area`` in diffs' dtype (the reference's rounding) for
    every non-empty bin; ``grad``: top_grad as [R*PH*PW, od] rows, ``edges`` from :func:`_bin_edges`."""
    dt = diffs.dtype.type
    od = grad.shape[1]
    for i in range(edges.shape[2]):
        for ph in range(ph_n):
            dh = edges[1, ph, i] - edges[0, ph, i]
            for pw in range(pw_n):
                area = dh * (edges[3, pw, i] - edges[2, pw, i])
                if area > 0:
                    a = dt(area)
                    row = (i * ph_n + ph) * pw_n + pw
                    for ctop in range(od):
                        diffs[row, ctop] = grad[row, ctop] / a


def _backward_canonical(edges, rois, ph_n, pw_n, grad, diffs, bottom, bs, shape, acc, rows_nhwc):
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
    The caller checked the batch indices."""
    n, c, height, width = shape
    r = rois.shape[0]
    groups = ph_n * pw_n
    od = c // groups
    _bin_diffs(edges, ph_n, pw_n, grad, diffs)
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
                hs, he = max(edges[0, ph, i], y0), min(edges[1, ph, i], y1)
                if he <= hs:
                    continue
                for pw in range(pw_n):
                    ws, we = edges[2, pw, i], edges[3, pw, i]
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


def _backward_any(g, gs, top_shape, rois, edges, mapping, ms, bottom, bs, shape):
    """Any in-range mapping_channel: contributions bucketed by destination plane (batch, channel) in the
    reference's order (RoI, ctop, ph, pw), then each plane sums its bucket (in bottom's dtype, the reference's
    rounding). The caller checked the batch indices and the mapping values."""
    dt = bottom.dtype.type
    r, od, ph_n, pw_n = top_shape
    n, c, height, width = shape
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
            hs, he, ws, we = edges[0, ph, i], edges[1, ph, i], edges[2, pw, i], edges[3, pw, i]
            if he > hs and we > ws:
                diff = g[i * gs[0] + ctop * gs[1] + ph * gs[2] + pw * gs[3]] / dt((he - hs) * (we - ws))
                _add_bin(bottom, plane, bs, hs, he, ws, we, diff)


@njit(error_model="numpy")
def _is_forward_mapping(mapping, ms, top_shape):
    """Whether every mapping_channel entry is the forward's ``(ctop*PH + ph)*PW + pw``. ``mapping`` is dense
    (NCHW or NHWC storage), so every RoI's block is one contiguous run: compared against a template in storage
    order with an OR of XORs (unsigned indices, no early exit), one long loop (~8 us for the doc's cases)."""
    r, od, ph_n, pw_n = top_shape
    groups = ph_n * pw_n
    block = od * groups
    template = np.empty(block, mapping.dtype)
    for ctop in range(od):
        for k in range(groups):
            template[ctop * ms[1] + (k // pw_n) * ms[2] + (k % pw_n) * ms[3]] = ctop * groups + k
    differ = mapping.dtype.type(0)
    u_block = np.uint64(block)
    for i in range(r):
        base = np.uint64(i) * u_block
        for e in range(block):
            differ |= mapping[base + np.uint64(e)] ^ template[e]
    return differ == 0


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
def _channel_blocks(od):
    """8-channel vector steps per bin of the table kernels (od < 8 runs od scalar steps, counted as one)."""
    return (od + _LANES - 1) // _LANES


@njit(error_model="numpy")
def _backward_table_pays(pixel_channels, bins, od, entries, table_bytes):
    """Whether the difference tables beat the direct scatter (backward). Costs in 0.1 ns, fitted to the
    kernels (serial; ``entries`` = pixels x channels of the images RoIs use): tables ~0.4 ns per entry (zero,
    prefix sum, transposed write) while one image's table fits in L2, ~1 ns beyond, and ~2.6 ns per bin and
    8-channel block; direct ~0.3 ns per bin pixel and channel, ~0.7 ns per entry and ~2 ns per bin. Measured
    whole ``backward`` calls: R-FCN g7 ~93 us vs ~194 us (g3 ~90 vs ~214); its 14 x 14 image with 1 or 40 RoIs
    ~43 vs ~59 us and ~50 vs ~77 us; a 64 x 64 image (13 MB table), 10 RoIs: 1.2 ms vs 0.86 ms."""
    per_entry = 4 if table_bytes <= _L2_BYTES else 10
    return per_entry * entries + 26 * bins * _channel_blocks(od) < 3 * pixel_channels + 7 * entries + 20 * bins


_L2_BYTES = 1 << 20  # L2 per core on the CI machine (AMD Zen 4), typical of current x86 cores


@njit(error_model="numpy")
def _grouped_table_pays(pixel_channels, bins, od, entries):
    """Whether the summed-area table beats the grouped direct forward. Costs in 0.05 ns, fitted to the kernels
    on the doc's cases (serial; ``entries`` = pixels x channels of the images RoIs use): table ~0.25 ns per
    entry (regroup and integrate) and ~3 ns per bin and 8-channel block; direct ~0.1 ns per entry (regroup),
    ~4 ns per bin and ~0.25 ns per bin pixel and channel. Measured whole ``forward`` calls: R-FCN g7 ~76 us vs
    ~120 us, g3 ~69 us vs ~154 us."""
    return 5 * entries + 60 * bins * _channel_blocks(od) < 2 * entries + 80 * bins + 5 * pixel_channels


_LANES = 8  # channels per vector step of the table kernels (transpose8's block, one 256-bit f32 / 2 f64 registers)
_U1, _U2, _U3, _U4, _U5, _U6, _U7 = (np.uint64(j) for j in range(1, _LANES))  # unsigned lane offsets


@njit(error_model="numpy")
def _transpose(src, src_at, src_stride, rows, cols, dst, dst_at, dst_stride):
    """``dst[dst_at + j*dst_stride + i] = src[src_at + i*src_stride + j]`` for i < rows, j < cols (in dst's
    dtype): one pixel's channels regrouped between the input's order (ctop*K + k) and the tables' (a run of od
    per bin). 8 x 8 register transposes; the last block of each axis overlaps the one before instead of
    needing a remainder loop (it rewrites the same values). Short axes take the scalar loop."""
    if rows >= _LANES and cols >= _LANES:
        for i in range(0, rows, _LANES):
            i0 = min(i, rows - _LANES)
            for j in range(0, cols, _LANES):
                j0 = min(j, cols - _LANES)
                transpose8(src, src_at + i0 * src_stride + j0, src_stride, dst, dst_at + j0 * dst_stride + i0,
                           dst_stride)
    else:
        for i in range(rows):
            for j in range(cols):
                dst[dst_at + j * dst_stride + i] = src[src_at + i * src_stride + j]


def _stride_of(od):
    """Entries per bin run in the tables: od rounded up to whole 8-lane blocks (od < 8 stays as is), so that
    every block of a float64 table starts on a cache line (the runs of R-FCN g3, od = 21, were split over
    two lines each). Also compiled, as :func:`_run_stride`."""
    return od if od < _LANES else (od + _LANES - 1) // _LANES * _LANES


_run_stride = njit(_stride_of, error_model="numpy")


@njit(error_model="numpy")
def _corner_lanes(table, hi_e, hi_s, lo_e, lo_s, inv_area, out, at):
    """``out[at + j] = ((T[hi_e + j] - T[hi_s + j]) - (T[lo_e + j] - T[lo_s + j])) * inv_area`` for j < 8.

    Written out lane by lane, every load before the first store, so the SLP vectoriser (``compile_slp``)
    emits vector code; indices are unsigned so numba adds no negative-index fix-ups that would stop it.
    The row differences are exactly +0 for an empty bin (both corners the same), so empty bins give +0."""
    t0 = (table[hi_e] - table[hi_s]) - (table[lo_e] - table[lo_s])
    t1 = (table[hi_e + _U1] - table[hi_s + _U1]) - (table[lo_e + _U1] - table[lo_s + _U1])
    t2 = (table[hi_e + _U2] - table[hi_s + _U2]) - (table[lo_e + _U2] - table[lo_s + _U2])
    t3 = (table[hi_e + _U3] - table[hi_s + _U3]) - (table[lo_e + _U3] - table[lo_s + _U3])
    t4 = (table[hi_e + _U4] - table[hi_s + _U4]) - (table[lo_e + _U4] - table[lo_s + _U4])
    t5 = (table[hi_e + _U5] - table[hi_s + _U5]) - (table[lo_e + _U5] - table[lo_s + _U5])
    t6 = (table[hi_e + _U6] - table[hi_s + _U6]) - (table[lo_e + _U6] - table[lo_s + _U6])
    t7 = (table[hi_e + _U7] - table[hi_s + _U7]) - (table[lo_e + _U7] - table[lo_s + _U7])
    out[at] = t0 * inv_area
    out[at + _U1] = t1 * inv_area
    out[at + _U2] = t2 * inv_area
    out[at + _U3] = t3 * inv_area
    out[at + _U4] = t4 * inv_area
    out[at + _U5] = t5 * inv_area
    out[at + _U6] = t6 * inv_area
    out[at + _U7] = t7 * inv_area


@njit(error_model="numpy")
def _summed_area_table(x, b, height, width, od, groups, table):
    """Image b's summed-area table, float64 [(H+1)*(W+1), K*S] flat (S = :func:`_run_stride`) with a zero top
    row and left column: entry (y, x, k*S + ctop) is the sum of input channel ``ctop*K + k`` over rows < y and
    columns < x; the S - od padding entries of each run are 0. Each pixel is regrouped into a line
    (:func:`_transpose`) and added to the running row sum; unsigned indices keep the K*S-long loops vector
    code. Returns whether some plane's total is not finite."""
    stride = _run_stride(od)
    kod = stride * groups
    x_kod = od * groups
    wide = width + 1
    line = np.zeros(kod, x.dtype)  # the input dtype: a float32 transpose costs ~25% less than one to float64
    running = np.empty(kod, np.float64)
    u_kod = np.uint64(kod)
    for j in range(wide * kod):  # top row
        table[np.uint64(j)] = 0
    for y in range(height):
        running[:] = 0
        above = np.uint64(y * wide) * u_kod
        here = above + np.uint64(wide) * u_kod
        for j in range(kod):  # left column
            table[here + np.uint64(j)] = 0
        for xx in range(width):
            _transpose(x, ((b * height + y) * width + xx) * x_kod, groups, od, groups, line, 0, stride)
            up = above + np.uint64(xx + 1) * u_kod
            at = here + np.uint64(xx + 1) * u_kod
            for j in range(kod):
                running[j] += line[j]
                table[at + np.uint64(j)] = table[up + np.uint64(j)] + running[j]
    corner = np.uint64(height * wide + width) * u_kod
    for j in range(kod):
        v = table[corner + np.uint64(j)]
        if not (v - v == 0):  # NaN or inf somewhere in the plane (or a float64 overflow)
            return True
    return False


@njit(error_model="numpy")
def _inverse_areas(largest):
    """``1/area`` (float64) for areas 0..largest, 0 for an empty bin: a lookup, as a division per bin is slow."""
    inverse = np.empty(largest + 1, np.float64)
    inverse[0] = 0.0
    for a in range(1, largest + 1):
        inverse[a] = 1.0 / np.float64(a)
    return inverse


@njit(error_model="numpy")
def _fill_mapping(mapping, template):
    """mapping [R, K*od] rows (storage order): every RoI's row is ``template``. An element loop: numba's
    array-to-slice assignment is ~9x slower here (31 us against 3.6 us for R-FCN g7)."""
    for i in range(mapping.shape[0]):
        for e in range(template.shape[0]):
            mapping[i, e] = template[e]


_TABLE_FORWARD = {}  # output_dim (0: any od that needs no padding) -> compiled table forward


def _table_forward_for(od: int):
    """The table forward compiled for one padded ``output_dim`` (R-FCN g3, od = 21: ~63 us against ~70 us with
    a run-time od), or one compilation for every od that needs no padding: measured on R-FCN g7 (od = 8), a
    compile-time od made the kernel slower (~76 against ~69 us), unlike the backward."""
    key = od if _stride_of(od) != od else 0
    kernel = _TABLE_FORWARD.get(key)
    if kernel is not None:
        return kernel
    OD, STRIDE = key, _stride_of(key)

    def table_forward(x, rois, edges, n, ph_n, pw_n, height, width, out, mapping, template, table, scale, method):
        """The summed-area-table forward (compiled with SLP). It first runs :func:`_plan` (``scale`` in the
        accumulation dtype, ``method``: AUTO/DIRECT/TABLE) and returns the first RoI with a bad batch index, or
        USE_DIRECT when direct summation pays (``edges`` then hold the bin edges for it), else -1 when done.

        x: input storage as flat NHWC [N*H*W*C] (acc dtype); out: flat [R*K*od] NHWC output rows (acc dtype);
        mapping: [R, K*od] rows (storage order) filled from ``template``; table: float64 scratch [(H+1)*(W+1)*K*S]
        (S = :func:`_run_stride`); ``edges`` from :func:`_plan` (batch indices already checked). Each used image in
        turn gets a summed-area table (:func:`_summed_area_table`) and its RoIs' bins are read from it, 4 corner rows
        (:func:`_corner_lanes`, od < 8 a scalar loop). Planes whose table is not finite (NaN/inf inputs, float64
        overflow) are summed again directly, in the reference's order, so NaN/inf land where the reference puts
        them."""
        dt = out.dtype.type
        groups = ph_n * pw_n
        od = OD if OD > 0 else template.shape[0] // groups
        stride = STRIDE if OD > 0 else od
        kod = groups * stride
        bad, use_table = _plan(rois, n, od, ph_n, pw_n, scale, height, width, method, edges, False)
        if bad >= 0 or not use_table:
            return bad if bad >= 0 else USE_DIRECT
        r = rois.shape[0]
        per_image = _batch_counts(rois, n)
        inverse = _inverse_areas(height * width)
        u_kod, u_od, u_stride, u_wide = np.uint64(kod), np.uint64(od), np.uint64(stride), np.uint64(width + 1)
        tail = np.uint64(stride - _LANES) if od >= _LANES else np.uint64(0)  # the last block of a run
        last = np.uint64(od - _LANES) if od >= _LANES else np.uint64(0)  # the block that ends at od
        u_bins = np.uint64(groups) * u_od  # out entries per RoI
        for b in range(n):  # one image at a time: its table stays in L2 while its RoIs read it
            if per_image[b] == 0:
                continue
            not_finite = _summed_area_table(x, b, height, width, od, groups, table)
            for i in range(r):
                if int(rois[i, 0]) != b:
                    continue
                at = np.uint64(i) * u_bins  # out offset of the current bin
                roi_end = at + u_bins
                for ph in range(ph_n):
                    hs, he = edges[0, ph, i], edges[1, ph, i]
                    lo = np.uint64(hs) * u_wide * u_kod
                    hi = np.uint64(he) * u_wide * u_kod
                    for pw in range(pw_n):
                        ws, we = edges[2, pw, i], edges[3, pw, i]
                        col = np.uint64(ph * pw_n + pw) * u_stride
                        inv_area = inverse[(he - hs) * (we - ws)]
                        c_s, c_e = np.uint64(ws) * u_kod + col, np.uint64(we) * u_kod + col
                        if od == _LANES:  # one block: no loop (the common R-FCN g7 shape)
                            _corner_lanes(table, hi + c_e, hi + c_s, lo + c_e, lo + c_s, inv_area, out, at)
                        elif od > _LANES:
                            for c0 in range(0, stride - _LANES, _LANES):
                                u0 = np.uint64(c0)
                                _corner_lanes(table, hi + c_e + u0, hi + c_s + u0, lo + c_e + u0, lo + c_s + u0,
                                              inv_area, out, at + u0)
                            # the run's last block: its lanes past od spill into the next bin's first entries, which
                            # that bin overwrites; a RoI's last bin (the next RoI may be done already) takes the block
                            # ending at od
                            u0 = tail if at + u_stride <= roi_end else last
                            _corner_lanes(table, hi + c_e + u0, hi + c_s + u0, lo + c_e + u0, lo + c_s + u0, inv_area,
                                          out, at + u0)
                        else:
                            for ctop in range(od):
                                j = np.uint64(ctop)
                                out[at + j] = ((table[hi + c_e + j] - table[hi + c_s + j])
                                               - (table[lo + c_e + j] - table[lo + c_s + j])) * inv_area
                        at += u_od
            if not_finite:
                _redo_bad_planes(x, rois, edges, ph_n, pw_n, height, width, table, b, out, dt)
        _fill_mapping(mapping, template)
        return -1

    table_forward.__qualname__ = f"table_forward_od{key}"
    kernel = _TABLE_FORWARD[key] = njit(table_forward, error_model="numpy")
    return kernel


@njit(error_model="numpy")
def _redo_bad_planes(x, rois, edges, ph_n, pw_n, height, width, table, b, out, dt):
    """The bins of image b's planes whose summed-area table (``table``) is not finite, summed as the reference
    does (same loop, same rounding). A plane is bad when its table's last entry is not finite."""
    groups = ph_n * pw_n
    od = out.shape[0] // (rois.shape[0] * groups)
    stride = _run_stride(od)
    x_kod = groups * od
    corner = ((height + 1) * (width + 1) - 1) * groups * stride
    for i in range(rois.shape[0]):
        if int(rois[i, 0]) != b:
            continue
        for ph in range(ph_n):
            hs, he = edges[0, ph, i], edges[1, ph, i]
            for pw in range(pw_n):
                ws, we = edges[2, pw, i], edges[3, pw, i]
                k = ph * pw_n + pw
                for ctop in range(od):
                    v = table[corner + k * stride + ctop]
                    if v - v == 0:
                        continue
                    acc = dt(0.0)
                    for y in range(hs, he):
                        for xx in range(ws, we):
                            acc += x[((b * height + y) * width + xx) * x_kod + ctop * groups + k]
                    area = (he - hs) * (we - ws)
                    out[(i * groups + k) * od + ctop] = acc / dt(area) if area > 0 else dt(0.0)


@njit(error_model="numpy")
def _summed_area(edges, r, ph_n, pw_n):
    """Sum over RoIs of their bins' areas (the pixels direct summation visits per output channel). RoI-inner
    loops, as in :func:`_axis_edges`, so it is vector code."""
    rows = np.zeros(r, np.int64)
    cols = np.zeros(r, np.int64)
    for p in range(ph_n):
        for i in range(r):
            rows[i] += max(edges[1, p, i] - edges[0, p, i], 0)
    for p in range(pw_n):
        for i in range(r):
            cols[i] += max(edges[3, p, i] - edges[2, p, i], 0)
    total = 0
    for i in range(r):
        total += rows[i] * cols[i]
    return total


@njit(error_model="numpy")
def _images_used(rois, n):
    counts = _batch_counts(rois, n)
    used = 0
    for b in range(n):
        used += counts[b] > 0
    return used


@njit(error_model="numpy")
def _plan(rois, n, od, ph_n, pw_n, scale, height, width, method, edges, backward):
    """(first bad RoI or -1, whether to use the tables) for the forward or the backward, in one call, filling
    ``edges`` (:func:`_bin_edges`, in the dtype of ``scale``): each numba call costs a microsecond or more, a
    visible share of the doc's cases, and returning a new array from one costs a few more (so ``edges`` is
    the caller's scratch)."""
    bad = _first_bad_batch(rois, n)
    if bad >= 0:
        return bad, False
    _bin_edges(rois, ph_n, pw_n, scale, height, width, np.empty((4, rois.shape[0]), type(scale)), edges)
    if method != AUTO:
        return -1, method == TABLE
    r = rois.shape[0]
    pixel_channels = _summed_area(edges, r, ph_n, pw_n) * od
    entries = _images_used(rois, n) * od * ph_n * pw_n * height * width
    if backward:
        table_bytes = (height + 2) * (width + 1) * ph_n * pw_n * _run_stride(od) * 8  # one image's
        return -1, _backward_table_pays(pixel_channels, r * ph_n * pw_n, od, entries, table_bytes)
    return -1, _grouped_table_pays(pixel_channels, r * ph_n * pw_n, od, entries)


@njit(error_model="numpy")
def _add_lanes(table, at, v0, v1, v2, v3, v4, v5, v6, v7):
    """``table[at + j] += v_j`` for j < 8: all loads, then all stores, so SLP makes it one vector update."""
    t0, t1, t2, t3 = table[at], table[at + _U1], table[at + _U2], table[at + _U3]
    t4, t5, t6, t7 = table[at + _U4], table[at + _U5], table[at + _U6], table[at + _U7]
    table[at] = t0 + v0
    table[at + _U1] = t1 + v1
    table[at + _U2] = t2 + v2
    table[at + _U3] = t3 + v3
    table[at + _U4] = t4 + v4
    table[at + _U5] = t5 + v5
    table[at + _U6] = t6 + v6
    table[at + _U7] = t7 + v7


@njit(error_model="numpy")
def _scatter_corners(table, hs_s, hs_e, he_s, he_e, grad, g_at, inv_area):
    """Adds ``v = grad[g_at + j] * inv_area`` (j < 8) at the corners of a bin of a difference table: +v at (hs, ws)
    and (he, we), -v at (hs, we) and (he, ws); the 2-D prefix sum of the table then holds v on every pixel of the
    bin. The corner offsets are distinct for a non-empty bin. (Masking lanes here, even with a mask that is all
    ones at run time, made LLVM give up the vector code: R-FCN g3 backward took ~5x longer.)"""
    v0 = grad[g_at] * inv_area
    v1 = grad[g_at + _U1] * inv_area
    v2 = grad[g_at + _U2] * inv_area
    v3 = grad[g_at + _U3] * inv_area
    v4 = grad[g_at + _U4] * inv_area
    v5 = grad[g_at + _U5] * inv_area
    v6 = grad[g_at + _U6] * inv_area
    v7 = grad[g_at + _U7] * inv_area
    _add_lanes(table, hs_s, v0, v1, v2, v3, v4, v5, v6, v7)
    _add_lanes(table, hs_e, -v0, -v1, -v2, -v3, -v4, -v5, -v6, -v7)
    _add_lanes(table, he_s, -v0, -v1, -v2, -v3, -v4, -v5, -v6, -v7)
    _add_lanes(table, he_e, v0, v1, v2, v3, v4, v5, v6, v7)


_TABLE_BACKWARD = {}  # output_dim -> compiled table backward


def _table_backward_for(od: int):
    """The table backward compiled for one ``output_dim`` (as :func:`_grouped_forward`): with od and the run
    stride known at compile time, R-FCN g7 (od = 8) takes ~85 us against ~110 us with a run-time od. The
    stride pads runs to whole cache lines when od is not a multiple of 8 (R-FCN g3, od = 21: ~80 us, against
    ~100 us with runs split over two lines)."""
    kernel = _TABLE_BACKWARD.get(od)
    if kernel is not None:
        return kernel
    OD, STRIDE = od, _stride_of(od)

    def table_backward(grad, rois, edges, ph_n, pw_n, height, width, rows, table, cover, scale, method):
        """The difference-table backward for the forward's mapping_channel (compiled with SLP). It first runs
        :func:`_plan` as the table forward does, with the same return codes.

        grad: top_grad as flat [R*K*od] NHWC rows (acc dtype); rows: bottom_grad as [N*H*W, C] NHWC rows (acc
        dtype); table: float64 scratch [(H+2)*(W+1)*K*S] (S = :func:`_run_stride`; entry k*S + ctop of a pixel,
        padding entries unused); cover: int32 scratch [(H+2)*(W+1)*K]. Per used image,
        every bin adds ``top_grad / area`` (8 channels at a time) at its 4 corners of the table and +-1 at the
        corners of ``cover``; one 2-D prefix sum then gives each pixel its summed gradient, and the coverage count
        makes pixels under no bin exactly 0. Each pixel's [K, od] values are written out in the input's channel
        order (ctop*K + k, register transposes). Row 0 of the tables is a zero row above the image, so the prefix
        needs no test for the first row. Also returns USE_DIRECT when a table is not finite (NaN/inf gradients,
        float64 overflow): the direct scatter then reproduces the reference's NaN/inf, overwriting everything."""
        n = rows.shape[0] // (height * width)
        c = rows.shape[1]
        groups = ph_n * pw_n
        od, stride = OD, STRIDE
        kod = groups * stride
        bad, use_table = _plan(rois, n, od, ph_n, pw_n, scale, height, width, method, edges, True)
        if bad >= 0 or not use_table:
            return bad if bad >= 0 else USE_DIRECT
        wide = width + 1
        r = rois.shape[0]
        per_image = _batch_counts(rois, n)
        inverse = _inverse_areas(height * width)
        u_kod, u_od, u_stride = np.uint64(kod), np.uint64(od), np.uint64(stride)
        u_k, u_wide = np.uint64(groups), np.uint64(wide)
        g_size = np.uint64(grad.shape[0])
        running = np.empty(kod, np.float64)
        running_cover = np.empty(groups, np.int32)
        non_finite = False  # a non-finite table value (NaN/inf gradient, float64 overflow): use the direct scatter
        flat = rows.reshape(rows.shape[0] * c)
        for b in range(n):
            first = b * height * width
            if per_image[b] == 0:
                rows[first:first + height * width, :] = 0
                continue
            table[:] = 0
            cover[:] = 0
            for i in range(r):
                if int(rois[i, 0]) != b:
                    continue
                for ph in range(ph_n):
                    hs, he = edges[0, ph, i], edges[1, ph, i]
                    top_row, bottom_row = np.uint64(hs + 1) * u_wide, np.uint64(he + 1) * u_wide
                    for pw in range(pw_n):
                        ws, we = edges[2, pw, i], edges[3, pw, i]
                        if he <= hs or we <= ws:
                            continue
                        inv_area = inverse[(he - hs) * (we - ws)]
                        k = np.uint64(ph * pw_n + pw)
                        corners = (top_row + np.uint64(ws), top_row + np.uint64(we),
                                   bottom_row + np.uint64(ws), bottom_row + np.uint64(we))
                        cover[corners[0] * u_k + k] += 1
                        cover[corners[1] * u_k + k] -= 1
                        cover[corners[2] * u_k + k] -= 1
                        cover[corners[3] * u_k + k] += 1
                        g_at = (np.uint64(i * groups) + k) * u_od
                        run = k * u_stride
                        c_hs_s, c_hs_e = corners[0] * u_kod + run, corners[1] * u_kod + run
                        c_he_s, c_he_e = corners[2] * u_kod + run, corners[3] * u_kod + run
                        if od == _LANES:  # one block, no loop: a loop here is rerolled into scalar code by LLVM
                            _scatter_corners(table, c_hs_s, c_hs_e, c_he_s, c_he_e, grad, g_at, inv_area)
                        elif od > _LANES and g_at + u_stride <= g_size:
                            # whole blocks: the last one's lanes past od add the next bin's gradient to padding
                            # entries, which nothing reads (the final bin has no next one: the scalar loop below)
                            for c0 in range(0, stride, _LANES):
                                u0 = np.uint64(c0)
                                _scatter_corners(table, c_hs_s + u0, c_hs_e + u0, c_he_s + u0, c_he_e + u0, grad,
                                                 g_at + u0, inv_area)
                        else:
                            for ctop in range(od):
                                u0 = np.uint64(ctop)
                                v = grad[g_at + u0] * inv_area
                                table[c_hs_s + u0] += v
                                table[c_hs_e + u0] -= v
                                table[c_he_s + u0] -= v
                                table[c_he_e + u0] += v
            for y in range(height):
                running[:] = 0
                running_cover[:] = 0
                for xx in range(width):
                    at = np.uint64((y + 1) * wide + xx)
                    up = at - u_wide
                    for j in range(kod):
                        running[j] += table[at * u_kod + np.uint64(j)]
                        table[at * u_kod + np.uint64(j)] = table[up * u_kod + np.uint64(j)] + running[j]
                    for k in range(groups):
                        running_cover[k] += cover[at * u_k + np.uint64(k)]
                        cover[at * u_k + np.uint64(k)] = cover[up * u_k + np.uint64(k)] + running_cover[k]
                    for k in range(groups):
                        if cover[at * u_k + np.uint64(k)] <= 0:
                            # a group no bin covers: exactly 0, not the table's rounding residue; 0 is also its
                            # exact prefix, so the rows below build on it unchanged. A non-finite value there
                            # would be hidden from the check below: remember it.
                            run = at * u_kod + np.uint64(k) * u_stride
                            for ctop in range(od):
                                v = table[run + np.uint64(ctop)]
                                non_finite |= not (v - v == 0)
                                table[run + np.uint64(ctop)] = 0.0
                    _transpose(table, int(at) * kod, stride, groups, od, flat, (first + y * width + xx) * c, groups)
            # non-finite gradients reach the last pixel (every bin's first corner is above-left of it) unless a
            # zeroed group cut them off on the way down its column, which ``non_finite`` recorded
            last = np.uint64(height * wide + width - 1) * u_kod
            for k in range(groups):
                for ctop in range(od):
                    v = table[last + np.uint64(k * stride + ctop)]
                    non_finite |= not (v - v == 0)
            if non_finite:
                return USE_DIRECT
        return -1

    table_backward.__qualname__ = f"table_backward_od{od}"
    kernel = _TABLE_BACKWARD[od] = njit(table_backward, error_model="numpy")
    return kernel


_GROUPED = {}  # output_dim -> compiled grouped forward


def _grouped_forward(od: int):
    """The direct forward compiled for one ``output_dim``: with od known at compile time the od-long loops are
    straight vector code (measured ~2x faster than a runtime od on the doc's cases). numba keys its disk
    cache on the closure's values too, so every od gets its own entry (~1.5 s to compile, once)."""
    kernel = _GROUPED.get(od)
    if kernel is not None:
        return kernel
    OD = od

    def grouped_forward(x, xr, rois, edges, n, ph_n, pw_n, height, width, out, mapping, template):
        """x: input storage as flat NHWC [N*H*W*C]; xr: scratch [N*H*W*K*OD] (acc dtype) that receives the
        input regrouped so that channel ctop*K + k sits at [.., k*OD + ctop] (one contiguous run of OD per
        pixel and bin); out: [R*K, OD] NHWC rows; mapping: [R, K*OD] rows (storage order); template: one
        RoI's mapping row; edges from :func:`_plan`.

        Sums every bin pixel by pixel, rows then columns, from 0, as the reference: the same bits."""
        dt = out.dtype.type
        per_image = _batch_counts(rois, n)
        groups = ph_n * pw_n
        kod = groups * OD
        for b in range(n):  # images no RoI reads are not regrouped
            if per_image[b] == 0:
                continue
            for p in range(b * height * width, (b + 1) * height * width):
                _transpose(x, p * kod, groups, OD, groups, xr, p * kod, OD)
        cells = xr.reshape(n * height * width * groups, OD)
        _fill_mapping(mapping, template)
        for i in range(rois.shape[0]):
            b = int(rois[i, 0])
            for ph in range(ph_n):
                hs, he = edges[0, ph, i], edges[1, ph, i]
                for pw in range(pw_n):
                    ws, we = edges[2, pw, i], edges[3, pw, i]
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
    """(flat numpy view of the storage, element strides) of a logical-NCHW view of a 4-D tensor stored dense
    NCHW or NHWC; any other layout is copied dense first (so a tensor written through the view must be dense).
    numpy views, as they cost ~1 us less than torch ones; the array keeps the tensor alive."""
    if t.requires_grad:
        t = t.detach()
    if t.is_contiguous():
        return t.numpy().reshape(-1), tuple(t.stride())
    if not t.is_contiguous(memory_format=torch.channels_last):
        t = t.contiguous()
        return t.numpy().reshape(-1), tuple(t.stride())
    return t.numpy().transpose(0, 2, 3, 1).reshape(-1), tuple(t.stride())


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
        buf = buffers[(name, dtype)] = _cache_aligned(max(size, 1), dtype)
    return buf[:size].reshape(shape)


def _cache_aligned(size: int, dtype) -> np.ndarray:
    """``np.empty(size, dtype)`` starting on a 64-byte cache line (numpy's own buffers are 16-byte aligned): the
    table kernels load 8-double runs, which then span one line instead of two (R-FCN g7 table forward ~84 ->
    ~67 us, backward ~115 -> ~98 us)."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(size + _LINE // itemsize, dtype)
    skip = (-raw.ctypes.data % _LINE) // itemsize
    return raw[skip:skip + size]


_LINE = 64  # bytes per cache line


def _np_dtype(acc: torch.dtype):
    return np.float64 if acc == torch.float64 else np.float32


@functools.lru_cache(maxsize=64)
def _mapping_template(od: int, ph_n: int, pw_n: int, nhwc: bool) -> np.ndarray:
    """One RoI's mapping_channel (channel ``ctop*K + k``) in storage order: [PH, PW, od] (NHWC) or [od, PH, PW]."""
    groups = ph_n * pw_n
    channels = np.arange(od * groups, dtype=np.int32)
    return np.ascontiguousarray(channels.reshape(od, groups).T).reshape(-1) if nhwc else channels


def _call_slp(kernel, args):
    """Runs a table kernel, compiled with the SLP vectoriser on (:func:`compile_slp`) on first use per
    (accumulation dtype, rois dtype): the wrappers build every other argument the same way (C-contiguous
    arrays, ints), so those two tell the signatures apart, and the per-call check stays one set lookup. The
    kernels' first argument has the accumulation dtype and the second is rois."""
    key = (kernel, args[0].dtype, args[1].dtype)
    if key not in _SLP_COMPILED:
        import numba
        compile_slp(kernel, tuple(numba.typeof(a) for a in args))
        _SLP_COMPILED.add(key)
    return kernel(*args)


_SLP_COMPILED = set()  # (kernel, accumulation dtype, rois dtype) compiled with SLP


def _rois_array(rois: torch.Tensor) -> np.ndarray:
    """rois as a C-contiguous float32/float64 numpy array (no copy when it already is one; float16/bfloat16
    widen to float32 exactly)."""
    if rois.requires_grad:
        rois = rois.detach()
    if rois.dtype not in (torch.float32, torch.float64):
        rois = rois.to(torch.float32)
    return (rois if rois.is_contiguous() else rois.contiguous()).numpy()


def _new_edges(r: int, ph_n: int, pw_n: int) -> np.ndarray:
    """Room for the bin edges (int32 [4, max(PH, PW), R], see :func:`_bin_edges`): small enough for a plain
    allocation, which costs less than a scratch lookup."""
    return np.empty((4, max(ph_n, pw_n), r), np.int32)


def _nhwc_flat(x: torch.Tensor) -> np.ndarray:
    """The elements of a logical-NCHW tensor in NHWC order, as a flat numpy array (a copy unless NHWC-dense)."""
    if x.requires_grad:
        x = x.detach()
    if x.is_contiguous(memory_format=torch.channels_last):  # numpy views cost less than torch ones
        return x.numpy().transpose(0, 2, 3, 1).reshape(-1)
    return x.permute(0, 2, 3, 1).contiguous().numpy().reshape(-1)


def forward(input, rois, pooled_height, pooled_width, spatial_scale, output_dim, out_layout="NCHW"):
    """As :func:`cpu.forward` but (output, mapping_channel) as stored: [R, od, PH, PW] (NCHW) or [R, PH, PW, od]
    (NHWC). The caller checked ``supports`` and non-empty tensors (:func:`cpu.fused_forward`)."""
    n, c, h, w = input.shape
    r, ph_n, pw_n, od = rois.shape[0], pooled_height, pooled_width, output_dim
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    dt = _np_dtype(acc)
    x_flat = _nhwc_flat(input if input.dtype == acc else input.to(acc))
    nhwc = out_layout == "NHWC"
    stored = (r, ph_n, pw_n, od) if nhwc else (r, od, ph_n, pw_n)
    # numpy allocations wrapped as tensors, reshaped by numpy: ~2 us less per tensor than torch.empty, .numpy()
    # and torch views
    mapping_np = np.empty(stored, np.int32)
    mapping, map_rows = torch.from_numpy(mapping_np), mapping_np.reshape(r, od * ph_n * pw_n)
    # the kernels write [R*PH*PW, od] rows: the output's own storage when it is NHWC in the acc dtype
    in_place = nhwc and input.dtype == acc
    if in_place:
        output_np = np.empty(stored, dt)
        output, rows = torch.from_numpy(output_np), output_np.reshape(-1)
    else:
        output, rows = torch.empty(stored, dtype=input.dtype), _scratch("rows", (r * ph_n * pw_n * od,), dt)
    template = _mapping_template(od, ph_n, pw_n, nhwc)
    rois_np = _rois_array(rois)
    edges = _new_edges(r, ph_n, pw_n)
    # the table kernel plans first (one numba call, not two) and returns USE_DIRECT when direct summation pays;
    # its scratch is then left untouched (a large one is only reserved: pages are mapped when first written)
    table = _scratch("table", ((h + 1) * (w + 1) * ph_n * pw_n * _stride_of(od),))
    status = _call_slp(_table_forward_for(od), (x_flat, rois_np, edges, n, ph_n, pw_n, h, w, rows, map_rows,
                                                template, table, dt(spatial_scale), METHOD))
    if status >= 0:
        checks.check_batch_indices(checks.OP, rois, n)  # raises, naming the RoI
    if status == USE_DIRECT:
        _grouped_forward(od)(x_flat, _scratch("grouped", (n * h * w * c,), dt), rois_np, edges, n, ph_n, pw_n, h, w,
                             rows.reshape(r * ph_n * pw_n, od), map_rows, template)
    if not in_place:  # one rounding to the output dtype, as the reference
        result = torch.from_numpy(rows).view(r, ph_n, pw_n, od)
        output.copy_(result if nhwc else result.permute(0, 3, 1, 2))
    return output, mapping


def _backward_direct(top_grad, edges, rois_np, b_flat, b_strides, shape, dt, work):
    """The direct backward for the forward's mapping_channel: ``top_grad / area`` per bin, then the scatter."""
    r, od, ph_n, pw_n = top_grad.shape
    n, c, h, w = shape
    grad = top_grad.permute(0, 2, 3, 1)  # [R, PH, PW, od]
    if not grad.is_contiguous():
        grad = grad.contiguous()
    diffs = _scratch("diffs", (r * ph_n * pw_n, od), dt)
    acc = _scratch("acc", (n * h * w * ph_n * pw_n, od), dt)
    _variant(_BACKWARD_CANONICAL, work)(edges, rois_np, ph_n, pw_n, grad.numpy().reshape(r * ph_n * pw_n, od), diffs,
                                        b_flat, b_strides, shape, acc, b_flat.reshape(n * h * w, c))


def backward(top_grad, rois, mapping_channel, spatial_scale, output_dim, input_shape, out_layout="NCHW",
             trusted_mapping=False):
    """As :func:`cpu.backward` but bottom_grad as stored: [N, C, H, W] (NCHW) or [N, H, W, C] (NHWC). The caller
    checked ``supports`` and non-empty tensors (:func:`cpu.fused_backward`)."""
    n, c, h, w = input_shape
    r, od, ph_n, pw_n = top_shape = tuple(top_grad.shape)
    acc = torch.float64 if top_grad.dtype == torch.float64 else torch.float32
    dt = _np_dtype(acc)
    g = top_grad if top_grad.dtype == acc else top_grad.to(acc)
    nhwc = out_layout == "NHWC"
    stored = (n, h, w, c) if nhwc else (n, c, h, w)
    target_np = np.empty(stored, dt)  # as in forward: a numpy allocation costs less than torch.empty
    target = torch.from_numpy(target_np)
    bottom = target if top_grad.dtype == acc else torch.empty(stored, dtype=top_grad.dtype)  # copied at the end
    canonical = trusted_mapping
    if not canonical:
        m_flat, m_strides = _flat(mapping_channel)
        canonical = _is_forward_mapping(m_flat, m_strides, top_shape)
        if not canonical:
            checks.check_mapping_values(checks.OP_BACKWARD, mapping_channel, c)
    rois_np = _rois_array(rois)
    edges = _new_edges(r, ph_n, pw_n)
    scale = dt(spatial_scale)
    if canonical:  # the table kernel plans first and returns USE_DIRECT when the direct scatter pays
        rows = target_np.reshape(n * h * w, c) if nhwc else _scratch("bottom_rows", (n * h * w, c), dt)
        cells = (h + 2) * (w + 1) * ph_n * pw_n
        table, cover = _scratch("table", (cells * _stride_of(od),)), _scratch("cover", (cells,), np.int32)
        status = _call_slp(_table_backward_for(od), (_nhwc_flat(g), rois_np, edges, ph_n, pw_n, h, w, rows, table,
                                                     cover, scale, METHOD))
        if status == -1 and not nhwc:
            target.copy_(torch.from_numpy(rows).view(n, h, w, c).permute(0, 3, 1, 2))
    else:
        bad, _ = _plan(rois_np, n, od, ph_n, pw_n, scale, h, w, DIRECT, edges, True)
        status = bad if bad >= 0 else USE_DIRECT
    if status >= 0:
        checks.check_batch_indices(checks.OP_BACKWARD, rois, n)  # raises, naming the RoI
    if status == USE_DIRECT:  # the direct kernels address the logical NCHW view through its strides
        b_flat, b_strides = _flat(as_nchw(target, out_layout))
        work = r * od * h * w + target.numel()  # as forward + zeroing
        if canonical:
            _backward_direct(g, edges, rois_np, b_flat, b_strides, (n, c, h, w), dt, work)
        else:
            g_flat, g_strides = _flat(g)
            _variant(_BACKWARD_ANY, work)(g_flat, g_strides, top_shape, rois_np, edges, m_flat, m_strides, b_flat,
                                          b_strides, (n, c, h, w))
    if target is not bottom:
        bottom.copy_(target)
    return bottom
