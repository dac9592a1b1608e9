"""CARAFE as compiled loops: the CPU fast path when numba is installed (see ``_core/jit.py``).

Why: CARAFE is ``k*k`` multiply-adds per output element with a different weight matrix per output
pixel, so it maps onto matrix products only as many tiny ones; their per-product overhead keeps the
torch path (``cpu.py``) far below the machine's FLOP rate. Here each kernel is one loop nest whose
innermost loop runs over channels, contiguous in a channels-last copy of the feature (and of
``grad_output``), so LLVM vectorises it; the ``k*k`` weights of a pixel are scalars broadcast over it.

* forward: per input row ``(n, y)``, the ``s*s`` output pixels of every block accumulate
  ``mask * x[tap]`` over the taps inside the map into a row buffer ``[s, s*W, C]`` (in cache), which
  is then stored in the output's layout (NCHW through 8 x 8 register transposes, ``transpose8``).
* grad_mask: per output pixel and tap inside the map, one dot product over channels of
  ``grad_output`` and the tap's feature vector; taps outside the map get 0.
* grad_input gathers: per input pixel, the sum over the ``(block, phase, tap)`` that read it of
  ``mask * grad_output`` (taps inside the map only, so a non-finite mask value on a tap outside the
  map never meets anything, as in the reference).

Every output element has one writer and a sum order fixed at compile time (``REASSOCIATE`` lets
LLVM vectorise the dot products), so results do not depend on the thread count. Accumulation is in
float32 (float64 for float64); float16/bfloat16 go through float32 copies.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from ..._core.bits import numpy_alias
from ..._core.jit import REASSOCIATE, njit
from ..._core.jit_intrinsics import transpose8
from ..._core.memory import new_empty
from ..._core.parallel import pool
from ..._core.transpose import to_channels_last

_LANES = 8  # transpose8's block
_PARALLEL_WORK = 1e6  # multiply-adds (tens of microseconds) below which one thread runs the call
_CHUNKS_PER_THREAD = 8


def supports(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype.is_floating_point for t in tensors)


# ------------------------------------------------------------------------------------------- kernels
@njit
def _store_rows(buf, rows, width, channels, out, out_at, plane, nchw):
    """Row buffer ``buf [rows, width, C]`` (channels-last) -> the output's rows starting at ``out_at``:
    NHWC ``out[out_at + (r*width + x)*C + c]``; NCHW ``out[out_at + c*plane + r*width + x]``."""
    u = np.uint64
    if not nchw:
        total = u(rows * width * channels)
        base = u(out_at)
        for i in range(total):
            out[base + i] = buf[i]
        return
    for r in range(rows):
        src_row = r * width * channels
        dst_row = out_at + r * width
        x_full = width - width % _LANES
        c_full = channels - channels % _LANES
        for x0 in range(0, x_full, _LANES):
            for c0 in range(0, c_full, _LANES):
                transpose8(buf, src_row + x0 * channels + c0, channels, out, dst_row + c0 * plane + x0, plane)
        for x in range(x_full, width):  # ragged edges: element by element
            for c in range(channels):
                out[u(dst_row + c * plane + x)] = buf[u(src_row + x * channels + c)]
        for x in range(x_full):
            for c in range(c_full, channels):
                out[u(dst_row + c * plane + x)] = buf[u(src_row + x * channels + c)]


@njit
def _row_taps(acc, at, count, src, src_at, src_step, weights, w_at, w_step, t0, t1):
    """``acc[at + i] += sum_t weights[w_at + t*w_step] * src[src_at + t*src_step + i]`` for
    ``t0 <= t < t1``, ``i < count``.

    The taps go five (then three, then one) to a pass, so each pass loads and stores the
    accumulators once for several multiply-adds (one pass per tap is bound by those loads and
    stores)."""
    u = np.uint64
    a = u(at)
    t = t0
    while t + 5 <= t1:
        w0 = weights[u(w_at + t * w_step)]
        w1 = weights[u(w_at + (t + 1) * w_step)]
        w2 = weights[u(w_at + (t + 2) * w_step)]
        w3 = weights[u(w_at + (t + 3) * w_step)]
        w4 = weights[u(w_at + (t + 4) * w_step)]
        b0 = u(src_at + t * src_step)
        b1 = u(src_at + (t + 1) * src_step)
        b2 = u(src_at + (t + 2) * src_step)
        b3 = u(src_at + (t + 3) * src_step)
        b4 = u(src_at + (t + 4) * src_step)
        for i in range(u(count)):
            acc[a + i] += (w0 * src[b0 + i] + w1 * src[b1 + i] + w2 * src[b2 + i] + w3 * src[b3 + i]
                           + w4 * src[b4 + i])
        t += 5
    while t + 3 <= t1:
        w0 = weights[u(w_at + t * w_step)]
        w1 = weights[u(w_at + (t + 1) * w_step)]
        w2 = weights[u(w_at + (t + 2) * w_step)]
        b0 = u(src_at + t * src_step)
        b1 = u(src_at + (t + 1) * src_step)
        b2 = u(src_at + (t + 2) * src_step)
        for i in range(u(count)):
            acc[a + i] += w0 * src[b0 + i] + w1 * src[b1 + i] + w2 * src[b2 + i]
        t += 3
    while t < t1:
        w0 = weights[u(w_at + t * w_step)]
        b0 = u(src_at + t * src_step)
        for i in range(u(count)):
            acc[a + i] += w0 * src[b0 + i]
        t += 1


@njit
def _row_taps_pair(acc, at_a, at_b, count, src, src_at, src_step, weights, w_a, w_b, w_step, t0, t1):
    """:func:`_row_taps` for two accumulators that read the same sources with their own weights (two
    sub-pixel phases of one block): each source vector is loaded once for both."""
    u = np.uint64
    a = u(at_a)
    b = u(at_b)
    t = t0
    while t + 5 <= t1:
        a0 = weights[u(w_a + t * w_step)]
        a1 = weights[u(w_a + (t + 1) * w_step)]
        a2 = weights[u(w_a + (t + 2) * w_step)]
        a3 = weights[u(w_a + (t + 3) * w_step)]
        a4 = weights[u(w_a + (t + 4) * w_step)]
        b0 = weights[u(w_b + t * w_step)]
        b1 = weights[u(w_b + (t + 1) * w_step)]
        b2 = weights[u(w_b + (t + 2) * w_step)]
        b3 = weights[u(w_b + (t + 3) * w_step)]
        b4 = weights[u(w_b + (t + 4) * w_step)]
        s0 = u(src_at + t * src_step)
        s1 = u(src_at + (t + 1) * src_step)
        s2 = u(src_at + (t + 2) * src_step)
        s3 = u(src_at + (t + 3) * src_step)
        s4 = u(src_at + (t + 4) * src_step)
        for i in range(u(count)):
            v0 = src[s0 + i]
            v1 = src[s1 + i]
            v2 = src[s2 + i]
            v3 = src[s3 + i]
            v4 = src[s4 + i]
            acc[a + i] += a0 * v0 + a1 * v1 + a2 * v2 + a3 * v3 + a4 * v4
            acc[b + i] += b0 * v0 + b1 * v1 + b2 * v2 + b3 * v3 + b4 * v4
        t += 5
    while t < t1:
        a0 = weights[u(w_a + t * w_step)]
        b0 = weights[u(w_b + t * w_step)]
        s0 = u(src_at + t * src_step)
        for i in range(u(count)):
            v0 = src[s0 + i]
            acc[a + i] += a0 * v0
            acc[b + i] += b0 * v0
        t += 1


def _forward(x, m, out, n_img, h, w, c, k, g, s, m_sn, m_sc, m_sy, m_sx, nchw, lo, hi):
    """``x`` channels-last ``[N, H, W, C]`` flat, ``m`` the mask's storage from ``mask[0, 0, 0, 0]`` with
    element strides ``m_s*``, ``out`` flat ``[N, sH, sW, C]`` (NHWC) or ``[N, C, sH, sW]`` (NCHW)."""
    u = np.uint64
    r = (k - 1) // 2
    cg = c // g
    sw = s * w
    sh = s * h
    plane = sh * sw
    buf = np.empty(s * sw * c, x.dtype)
    for row in range(lo, hi):
        n = row // h
        y = row % h
        ky0 = max(0, r - y)
        ky1 = min(k, h + r - y)
        for xx in range(w):
            kx0 = max(0, r - xx)
            kx1 = min(k, w + r - xx)
            for py in range(s):
                oy = y * s + py
                for px in range(0, s, 2):  # phases in pairs (the last alone for odd s)
                    ox = xx * s + px
                    pair = px + 1 < s
                    o = u((py * sw + ox) * c)
                    for ci in range(u(c * (2 if pair else 1))):  # phase px + 1 follows at o + c
                        buf[o + ci] = 0
                    m_at = n * m_sn + oy * m_sy + ox * m_sx
                    for gi in range(g):
                        ob = o + u(gi * cg)
                        for ky in range(ky0, ky1):
                            x_row = ((n * h + y + ky - r) * w + xx - r) * c + gi * cg
                            w_row = m_at + (gi * k + ky) * k * m_sc
                            if pair:
                                _row_taps_pair(buf, ob, ob + u(c), cg, x, x_row, c, m, w_row, w_row + m_sx, m_sc,
                                               kx0, kx1)
                            else:
                                _row_taps(buf, ob, cg, x, x_row, c, m, w_row, m_sc, kx0, kx1)
        if nchw:
            _store_rows(buf, s, sw, c, out, n * c * plane + y * s * sw, plane, True)
        else:
            _store_rows(buf, s, sw, c, out, (n * sh + y * s) * sw * c, plane, False)


@njit(fastmath=REASSOCIATE)
def _dots_2x4(gy, a, b, x, x_at, step, count):
    """The eight dot products ``gy[a:a+count]`` and ``gy[b:b+count]`` with ``x[x_at + j*step:][:count]``
    for ``j < 4``: each of the six vectors is loaded once per lane block."""
    u = np.uint64
    x0 = u(x_at)
    x1 = u(x_at + step)
    x2 = u(x_at + 2 * step)
    x3 = u(x_at + 3 * step)
    zero = gy.dtype.type(0)
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = zero
    for i in range(u(count)):
        ga = gy[a + i]
        gb = gy[b + i]
        v0 = x[x0 + i]
        v1 = x[x1 + i]
        v2 = x[x2 + i]
        v3 = x[x3 + i]
        a0 += ga * v0
        a1 += ga * v1
        a2 += ga * v2
        a3 += ga * v3
        b0 += gb * v0
        b1 += gb * v1
        b2 += gb * v2
        b3 += gb * v3
    return a0, a1, a2, a3, b0, b1, b2, b3


def _grad_mask(gy, x, gm, n_img, h, w, c, k, g, s, g_sn, g_sc, g_sy, g_sx, lo, hi):
    """``gm[n, (g*k + ky)*k + kx, oy, ox] = sum_c gy[n, oy, ox, c] * x[n, tap, c]`` (0 off the map);
    ``gy`` and ``x`` channels-last flat, ``gm`` written through element strides ``g_s*``."""
    u = np.uint64
    r = (k - 1) // 2
    cg = c // g
    sw = s * w
    sh = s * h
    for row in range(lo, hi):
        n = row // sh
        oy = row % sh
        y = oy // s
        for xx in range(w):
            for px in range(0, s, 2):  # phases in pairs: both read the same taps
                ox = xx * s + px
                pair = px + 1 < s
                gy_a = ((n * sh + oy) * sw + ox) * c
                gy_b = gy_a + c if pair else gy_a
                out_at = n * g_sn + oy * g_sy + ox * g_sx
                for gi in range(g):
                    a = u(gy_a + gi * cg)
                    b = u(gy_b + gi * cg)
                    for ky in range(k):
                        iy = y + ky - r
                        kx = 0
                        while kx < k:
                            ix = xx + kx - r
                            at = out_at + ((gi * k + ky) * k + kx) * g_sc
                            x_at = ((n * h + iy) * w + ix) * c + gi * cg
                            if iy >= 0 and iy < h and ix >= 0 and ix + 3 < w and kx + 4 <= k:
                                # four taps of the row at once: 6 loads per 8 multiply-adds
                                t = _dots_2x4(gy, a, b, x, x_at, c, cg)
                                for j in range(4):
                                    gm[u(at + j * g_sc)] = t[j]
                                    if pair:
                                        gm[u(at + j * g_sc + g_sx)] = t[4 + j]
                                kx += 4
                                continue
                            total_a = gm.dtype.type(0)
                            total_b = gm.dtype.type(0)
                            if iy >= 0 and iy < h and ix >= 0 and ix < w:
                                xb = u(x_at)
                                for ci in range(u(cg)):
                                    v = x[xb + ci]
                                    total_a += gy[a + ci] * v
                                    total_b += gy[b + ci] * v
                            gm[u(at)] = total_a
                            if pair:
                                gm[u(at + g_sx)] = total_b
                            kx += 1


def _grad_input(gy, m, gx, n_img, h, w, c, k, g, s, m_sn, m_sc, m_sy, m_sx, nchw, lo, hi):
    """``gx[n, iy, ix, c] = sum mask[n, tap, oy, ox] * gy[n, oy, ox, c]`` over the output pixels
    ``(oy, ox)`` whose tap reads ``(iy, ix)``; ``gy`` channels-last flat, ``gx`` flat NHWC or NCHW."""
    r = (k - 1) // 2
    cg = c // g
    sw = s * w
    sh = s * h
    buf = np.empty(w * c, gy.dtype)
    for row in range(lo, hi):
        n = row // h
        iy = row % h
        buf[:] = 0
        ky0 = max(0, iy + r - h + 1)
        ky1 = min(k, iy + r + 1)
        for ix in range(w):
            kx0 = max(0, ix + r - w + 1)
            kx1 = min(k, ix + r + 1)
            for gi in range(g):
                ob = ix * c + gi * cg
                for ky in range(ky0, ky1):
                    by = iy - ky + r
                    for py in range(s):
                        oy = by * s + py
                        for px in range(s):
                            # tap kx reads block bx = ix - kx + r: sources and weights step linearly in kx
                            ox_r = (ix + r) * s + px
                            gy_at = ((n * sh + oy) * sw + ox_r) * c + gi * cg
                            w_at = n * m_sn + (gi * k + ky) * k * m_sc + oy * m_sy + ox_r * m_sx
                            _row_taps(buf, ob, cg, gy, gy_at, -s * c, m, w_at, m_sc - s * m_sx, kx0, kx1)
        if nchw:
            _store_rows(buf, 1, w, c, gx, n * c * h * w + iy * w, h * w, True)
        else:
            _store_rows(buf, 1, w, c, gx, (n * h + iy) * w * c, h * w, False)


def _to_channels_last(src, dst, n_img, c, hw, lo, hi):
    """``dst[n, p, c] = src[n, c, p]`` (flat, contiguous) through 8 x 8 register transposes."""
    u = np.uint64
    p_full = hw - hw % _LANES
    c_full = c - c % _LANES
    for task in range(lo, hi):
        n = task // ((hw + 63) // 64)
        p_lo = (task % ((hw + 63) // 64)) * 64
        p_hi = min(p_lo + 64, hw)
        base = n * c * hw
        for p0 in range(p_lo, min(p_hi, p_full), _LANES):
            for c0 in range(0, c_full, _LANES):
                transpose8(src, base + c0 * hw + p0, hw, dst, base + p0 * c + c0, c)
            for ci in range(c_full, c):
                for p in range(p0, p0 + _LANES):
                    dst[u(base + p * c + ci)] = src[u(base + ci * hw + p)]
        for p in range(max(p_lo, p_full), p_hi):
            for ci in range(c):
                dst[u(base + p * c + ci)] = src[u(base + ci * hw + p)]


_to_channels_last = njit(_to_channels_last)
_forward = njit(_forward, fastmath=REASSOCIATE)
_grad_mask = njit(_grad_mask, fastmath=REASSOCIATE)
_grad_input = njit(_grad_input, fastmath=REASSOCIATE)


# ------------------------------------------------------------------------------------------- entry
def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _channels_last(t: torch.Tensor, acc: torch.dtype) -> np.ndarray:
    """Flat contiguous channels-last copy (or view) of logical-NCHW ``t`` in ``acc``."""
    t = t.to(acc)
    if t.is_contiguous():
        n, c, h, w = t.shape
        out = new_empty((n, h, w, c), acc, t.device)
        flat = numpy_alias(out.view(-1))
        _split(_to_channels_last, (numpy_alias(t.view(-1)), flat, n, c, h * w), n * ((h * w + 63) // 64),
               t.numel() * 8)
        return flat
    return numpy_alias(to_channels_last(t).reshape(-1))


def _strided(t: torch.Tensor, acc: torch.dtype):
    """``t`` in ``acc`` as its storage from ``t[0, 0, 0, 0]`` and its element strides (no copy when
    ``t`` is already ``acc``)."""
    if t.dtype != acc:
        t = t.to(acc)
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    flat = torch.as_strided(t, (span,), (1,), t.storage_offset())
    return numpy_alias(flat), t.stride()


def _split(kernel, args, rows, work):
    """``kernel(*args, lo, hi)`` over the rows ``[0, rows)``: on the calling thread for small calls,
    else in chunks that the caller and the shared worker threads claim one by one (a worker the OS
    deschedules holds up one chunk, not half the work). The kernels release the GIL.

    Python threads rather than numba's ``prange``: numba's OpenMP pool is a second OpenMP runtime
    beside torch's, and its fork/join waits for a descheduled or still-spinning thread of the other
    runtime cost milliseconds per call."""
    threads = torch.get_num_threads()
    if threads < 2 or rows < 2 or work < _PARALLEL_WORK:
        kernel(*args, 0, rows)
        return
    chunks = min(rows, threads * _CHUNKS_PER_THREAD)
    bounds = [rows * i // chunks for i in range(chunks + 1)]
    claim = itertools.count()

    def take():
        i = next(claim)
        while i < chunks:
            kernel(*args, bounds[i], bounds[i + 1])
            i = next(claim)

    helpers = [pool(threads).submit(take) for _ in range(threads - 1)]
    take()
    for helper in helpers:
        helper.result()


def forward(features, masks, kernel_size, group_size, scale_factor, layout="NCHW"):
    """Same contract as ``cpu.forward``."""
    n, c, h, w = features.shape
    k, g, s = kernel_size, group_size, scale_factor
    acc = _acc_dtype(features.dtype)
    x = _channels_last(features, acc)
    m, (m_sn, m_sc, m_sy, m_sx) = _strided(masks, acc)
    nchw = layout != "NHWC"
    shape = (n, c, h * s, w * s) if nchw else (n, h * s, w * s, c)
    out = new_empty(shape, acc, features.device)
    _split(_forward, (x, m, numpy_alias(out.view(-1)), n, h, w, c, k, g, s, m_sn, m_sc, m_sy, m_sx, nchw), n * h,
           n * c * h * w * s * s * k * k)
    out = out.to(features.dtype)
    return out if nchw else out.permute(0, 3, 1, 2)


def backward(grad_output, features, masks, kernel_size, group_size, scale_factor, layout="NCHW"):
    """Same contract as ``cpu.backward``."""
    n, c, h, w = features.shape
    k, g, s = kernel_size, group_size, scale_factor
    acc = _acc_dtype(features.dtype)
    x = _channels_last(features, acc)
    gy = _channels_last(grad_output, acc)
    m, (m_sn, m_sc, m_sy, m_sx) = _strided(masks, acc)
    nchw = layout != "NHWC"
    work = n * c * h * w * s * s * k * k
    gk = g * k * k
    if nchw:
        gm = new_empty((n, gk, h * s, w * s), acc, features.device)
        gm_strides = gm.stride()
        gx = new_empty((n, c, h, w), acc, features.device)
    else:
        gm_nhwc = new_empty((n, h * s, w * s, gk), acc, features.device)
        gm = gm_nhwc.permute(0, 3, 1, 2)
        gm_strides = gm.stride()
        gx = new_empty((n, h, w, c), acc, features.device)
    gm_flat = numpy_alias((gm if nchw else gm_nhwc).view(-1))
    _split(_grad_mask, (gy, x, gm_flat, n, h, w, c, k, g, s, *gm_strides), n * h * s, work)
    _split(_grad_input, (gy, m, numpy_alias(gx.view(-1)), n, h, w, c, k, g, s, m_sn, m_sc, m_sy, m_sx, nchw),
           n * h, work)
    gi = gx if nchw else gx.permute(0, 3, 1, 2)
    return gi.to(features.dtype), gm.to(masks.dtype)
