"""psroipool as fused numba loops: the CPU fast path when numba is installed (see ``_core/jit.py``).

Why: the doc's network cases move only 1-2 MB, less than the fixed cost of the ~35 eager ops of the
vectorised torch path (``cpu.py``), which therefore stays far below the IO-efficiency goal. One compiled
call per direction does the whole job here; ``cpu.py`` remains the fallback and the path for anything
this module does not take.

The loops are the reference's (``reference.py``): the same bin-edge arithmetic in the accumulation dtype
(float32, float64 for float64; one rounding per operation, no fastmath), and every bin summed pixel by
pixel in the same order. Results therefore equal the reference's bit for bit, NaN/inf included.

* forward: parallel over RoIs; each RoI writes only its own output and mapping_channel entries.
* backward: parallel over destination planes (batch, channel); each plane gathers its contributions in the
  reference's order (RoI, ctop, ph, pw), so there are no races and every run gives the same bits.

Tensors reach the kernels as flat storage plus element strides of their logical NCHW view (dense NCHW or
NHWC storage), so each kernel compiles once per dtype whatever the layout.
"""
from __future__ import annotations

import numpy as np
import torch
from numba import prange

from ..._core.jit import match_torch_threads, njit, njit_variants, use_parallel
from ..._core.layout import empty_nchw
from . import checks

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def supports(*tensors: torch.Tensor) -> bool:
    """CPU tensors of a dtype this path handles (floating inputs; index tensors are checked elsewhere)."""
    return all(t.device.type == "cpu" for t in tensors) and tensors[0].dtype in SUPPORTED


# ------------------------------------------------------------------------------------------- kernels
@njit
def _round_half_away(v, dt):
    t = np.trunc(v)
    if abs(v - t) >= dt(0.5):
        return t + dt(1.0) if v > 0 else t - dt(1.0)
    return t  # NaN and inf come back unchanged


@njit
def _clamp_index(v, limit):
    """A floored/ceiled edge clamped to [0, limit]; NaN gives 0."""
    if v != v or v <= 0:
        return 0
    if v >= limit:
        return limit
    return int(v)


@njit
def _roi_edges(rois, i, ph_n, pw_n, scale, height, width, dt, edges):
    """edges[0|1, p]: hs/he of bin row p; edges[2|3, p]: ws/we of bin column p (R-FCN arithmetic in dt)."""
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
        edges[0, p] = _clamp_index(np.floor(dt(p) * bin_h + start_h), height)
        edges[1, p] = _clamp_index(np.ceil(dt(p + 1) * bin_h + start_h), height)
    for p in range(pw_n):
        edges[2, p] = _clamp_index(np.floor(dt(p) * bin_w + start_w), width)
        edges[3, p] = _clamp_index(np.ceil(dt(p + 1) * bin_w + start_w), width)


@njit
def _first_bad_batch(rois, batch):
    """Index of the first RoI whose int(batch index) is outside [0, batch), or -1."""
    for i in range(rois.shape[0]):
        b = rois[i, 0]
        if not (b > -1 and b < batch):
            return i
    return -1


def _forward_kernel(x, xs, shape, rois, ph_n, pw_n, scale, od, out, ost, mapping, ms, dt):
    """x: flat input, logical [N, C, H, W] with element strides xs; out/mapping: flat dense [R, od, PH, PW]
    with strides ost/ms (each RoI's block contiguous). Returns the first RoI with a bad batch index
    (nothing written), or -1."""
    bad = _first_bad_batch(rois, shape[0])
    if bad >= 0:
        return bad
    height, width = shape[2], shape[3]
    groups = ph_n * pw_n
    block = od * groups
    template = np.empty(block, mapping.dtype)  # one RoI's mapping_channel, in storage order
    for ctop in range(od):
        for k in range(groups):
            template[ctop * ms[1] + (k // pw_n) * ms[2] + (k % pw_n) * ms[3]] = ctop * groups + k
    ctop_stride = groups * xs[1]
    for i in prange(rois.shape[0]):
        mapping[i * block:(i + 1) * block] = template
        out[i * block:(i + 1) * block] = 0
        edges = np.empty((4, max(ph_n, pw_n)), np.int64)
        _roi_edges(rois, i, ph_n, pw_n, scale, height, width, dt, edges)
        base = int(rois[i, 0]) * xs[0]
        for ph in range(ph_n):
            hs, he = edges[0, ph], edges[1, ph]
            if he <= hs:
                continue  # empty bins stay 0
            for pw in range(pw_n):
                ws, we = edges[2, pw], edges[3, pw]
                if we <= ws:
                    continue
                k = ph * pw_n + pw
                top = i * ost[0] + ph * ost[2] + pw * ost[3]
                # every output sums its bin row by row from 0, as the reference; the od outputs of a bin
                # are interleaved (independent chains; contiguous reads for NHWC storage)
                for y in range(hs, he):
                    for xx in range(ws, we):
                        pixel = base + k * xs[1] + y * xs[2] + xx * xs[3]
                        for ctop in range(od):
                            out[top + ctop * ost[1]] += x[pixel + ctop * ctop_stride]
                area = dt((he - hs) * (we - ws))
                for ctop in range(od):
                    out[top + ctop * ost[1]] /= area
    return -1


@njit
def _all_edges(rois, ph_n, pw_n, scale, height, width, dt):
    edges = np.empty((rois.shape[0], 4, max(ph_n, pw_n)), np.int64)
    for i in range(rois.shape[0]):
        _roi_edges(rois, i, ph_n, pw_n, scale, height, width, dt, edges[i])
    return edges


@njit
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


@njit
def _add_bin(bottom, plane, bs, hs, he, ws, we, diff):
    for y in range(hs, he):
        for xx in range(ws, we):
            bottom[plane + y * bs[2] + xx * bs[3]] += diff


@njit
def _zero_plane(bottom, plane, bs, height, width):
    for y in range(height):
        for xx in range(width):
            bottom[plane + y * bs[2] + xx * bs[3]] = 0


def _backward_canonical(g, gs, top_shape, rois, scale, bottom, bs, shape, dt):
    """mapping_channel is the forward's: channel ctop*K + k of image b gets bin k of channel ctop of every
    RoI of that image. One task per ctop owns those K channels and adds the RoIs in index order (the
    reference's order), so no two tasks touch the same element. g: flat top_grad [R, od, PH, PW] (strides
    gs); bottom: flat dense [N, C, H, W] (strides bs)."""
    bad = _first_bad_batch(rois, shape[0])
    if bad >= 0:
        return bad
    r, od, ph_n, pw_n = top_shape
    height, width = shape[2], shape[3]
    groups = ph_n * pw_n
    edges = _all_edges(rois, ph_n, pw_n, scale, height, width, dt)
    bottom[:] = 0
    for ctop in prange(od):
        for i in range(r):
            first = int(rois[i, 0]) * bs[0] + ctop * groups * bs[1]
            for ph in range(ph_n):
                hs, he = edges[i, 0, ph], edges[i, 1, ph]
                if he <= hs:
                    continue
                for pw in range(pw_n):
                    ws, we = edges[i, 2, pw], edges[i, 3, pw]
                    if we <= ws:
                        continue
                    diff = g[i * gs[0] + ctop * gs[1] + ph * gs[2] + pw * gs[3]] / dt((he - hs) * (we - ws))
                    _add_bin(bottom, first + (ph * pw_n + pw) * bs[1], bs, hs, he, ws, we, diff)
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


@njit
def _count_foreign(mapping, ms, top_shape):
    """How many mapping_channel entries differ from the forward's ``(ctop*PH + ph)*PW + pw``."""
    r, od, ph_n, pw_n = top_shape
    foreign = 0
    for i in range(r):
        for ctop in range(od):
            for ph in range(ph_n):
                for pw in range(pw_n):
                    if mapping[i * ms[0] + ctop * ms[1] + ph * ms[2] + pw * ms[3]] != (ctop * ph_n + ph) * pw_n + pw:
                        foreign += 1
    return foreign


_FORWARD = njit_variants(_forward_kernel)
_BACKWARD_CANONICAL = njit_variants(_backward_canonical)
_BACKWARD_ANY = njit_variants(_backward_any)


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


def _np_dtype(acc: torch.dtype):
    return np.float64 if acc == torch.float64 else np.float32


def _acc_target(out: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """Where the kernel writes: ``out`` itself when it has the accumulation dtype, else an acc twin (same
    layout); the caller copies back (one rounding, as the reference)."""
    return out if out.dtype == acc else torch.empty_like(out, dtype=acc)


def _rois64(rois: torch.Tensor) -> np.ndarray:
    return rois.detach().to(torch.float64).contiguous().numpy()


def forward(input, rois, pooled_height, pooled_width, spatial_scale, output_dim, out_layout="NCHW"):
    """As :func:`cpu.forward`; the caller checked ``supports`` and non-empty tensors."""
    n, c, h, w = input.shape
    r = rois.shape[0]
    shape = (r, output_dim, pooled_height, pooled_width)
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    x, x_flat, x_strides = _flat(input if input.dtype == acc else input.to(acc))
    output = empty_nchw(shape, out_layout, like=input)
    mapping = empty_nchw(shape, out_layout, like=input.new_empty(0, dtype=torch.int32))
    target = _acc_target(output, acc)
    _, out_flat, out_strides = _flat(target)
    _, map_flat, map_strides = _flat(mapping)
    dt = _np_dtype(acc)
    kernel = _variant(_FORWARD, r * output_dim * h * w)  # ~ pixel reads (every RoI covering the image)
    bad = kernel(x_flat, x_strides, (n, c, h, w), _rois64(rois), pooled_height, pooled_width,
                          dt(spatial_scale), output_dim, out_flat, out_strides, map_flat, map_strides, dt)
    if bad >= 0:
        checks.check_batch_indices(checks.OP, rois, n)  # raises, naming the RoI
    if target is not output:
        output.copy_(target)
    return output, mapping


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
        kernel = _variant(_BACKWARD_CANONICAL, work)
        bad = kernel(g_flat, g_strides, top_shape, rois64, scale, b_flat, b_strides, (n, c, h, w), dt)
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
