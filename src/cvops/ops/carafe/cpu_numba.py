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
# input rows per backward span at least: each span regroups the r block rows beyond its ends again
_BACKWARD_ROWS = 12


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


@njit
def _rows_channels_last(src, src_at, plane, dst, dst_at, channels, count):
    """``dst[dst_at + p*C + c] = src[src_at + c*plane + p]`` for ``p < count``, ``c < C``: positions of
    an NCHW plane regrouped channels-last through 8 x 8 register transposes."""
    u = np.uint64
    p_full = count - count % _LANES
    c_full = channels - channels % _LANES
    for c0 in range(0, c_full, _LANES):  # eight channel rows at a time: eight sequential read streams
        for p0 in range(0, p_full, _LANES):
            transpose8(src, src_at + c0 * plane + p0, plane, dst, dst_at + p0 * channels + c0, channels)
    for ci in range(c_full, channels):
        for p in range(p_full):
            dst[u(dst_at + p * channels + ci)] = src[u(src_at + ci * plane + p)]
    for p in range(p_full, count):
        for ci in range(channels):
            dst[u(dst_at + p * channels + ci)] = src[u(src_at + ci * plane + p)]


@njit(fastmath=REASSOCIATE)
def _scatter_taps(acc, acc_at, acc_step, count, src, s0, s1, s2, s3, wq, t0, t1):
    """``acc[acc_at + t*acc_step + i] += sum_j wq[4*t + j] * src[s_j + i]`` for ``t0 <= t < t1``,
    ``i < count``: four sub-pixel phases of one block spread over its taps, two taps a pass (each
    pass loads the four phase vectors once for two accumulators)."""
    u = np.uint64
    a0, a1, a2, a3 = u(s0), u(s1), u(s2), u(s3)
    t = t0
    while t + 2 <= t1:
        w0, w1, w2, w3 = wq[u(4 * t)], wq[u(4 * t + 1)], wq[u(4 * t + 2)], wq[u(4 * t + 3)]
        v0, v1, v2, v3 = wq[u(4 * t + 4)], wq[u(4 * t + 5)], wq[u(4 * t + 6)], wq[u(4 * t + 7)]
        b = u(acc_at + t * acc_step)
        d = u(acc_at + (t + 1) * acc_step)
        for i in range(u(count)):
            g0 = src[a0 + i]
            g1 = src[a1 + i]
            g2 = src[a2 + i]
            g3 = src[a3 + i]
            acc[b + i] += w0 * g0 + w1 * g1 + w2 * g2 + w3 * g3
            acc[d + i] += v0 * g0 + v1 * g1 + v2 * g2 + v3 * g3
        t += 2
    if t < t1:
        w0, w1, w2, w3 = wq[u(4 * t)], wq[u(4 * t + 1)], wq[u(4 * t + 2)], wq[u(4 * t + 3)]
        b = u(acc_at + t * acc_step)
        for i in range(u(count)):
            acc[b + i] += w0 * src[a0 + i] + w1 * src[a1 + i] + w2 * src[a2 + i] + w3 * src[a3 + i]


@njit(fastmath=REASSOCIATE)
def _dots_4x4(src, s0, s1, s2, s3, x, x_at, x_step, count):
    """The 16 dot products of four phase vectors ``src[s_j:][:count]`` with the four tap vectors
    ``x[x_at + t*x_step:][:count]`` (8 loads per 16 multiply-adds); entry ``4*t + j``."""
    u = np.uint64
    a0, a1, a2, a3 = u(s0), u(s1), u(s2), u(s3)
    b0, b1, b2, b3 = u(x_at), u(x_at + x_step), u(x_at + 2 * x_step), u(x_at + 3 * x_step)
    z = src.dtype.type(0)
    r00 = r01 = r02 = r03 = r10 = r11 = r12 = r13 = z
    r20 = r21 = r22 = r23 = r30 = r31 = r32 = r33 = z
    for i in range(u(count)):
        g0 = src[a0 + i]
        g1 = src[a1 + i]
        g2 = src[a2 + i]
        g3 = src[a3 + i]
        v = x[b0 + i]
        r00 += g0 * v
        r01 += g1 * v
        r02 += g2 * v
        r03 += g3 * v
        v = x[b1 + i]
        r10 += g0 * v
        r11 += g1 * v
        r12 += g2 * v
        r13 += g3 * v
        v = x[b2 + i]
        r20 += g0 * v
        r21 += g1 * v
        r22 += g2 * v
        r23 += g3 * v
        v = x[b3 + i]
        r30 += g0 * v
        r31 += g1 * v
        r32 += g2 * v
        r33 += g3 * v
    return (r00, r01, r02, r03, r10, r11, r12, r13, r20, r21, r22, r23, r30, r31, r32, r33)


def _backward(gy, x, m, gx, gm, n_img, h, w, c, k, g, s, gy_nhwc, m_sn, m_sc, m_sy, m_sx,
              g_sn, g_sc, g_sy, g_sx, gx_nchw, lo, hi):
    """Both gradients of the input rows ``[lo, hi)`` (``n*H + y``) and of the blocks of those rows.

    ``gy`` is grad_output flat NHWC (``gy_nhwc``) or contiguous NCHW, ``x`` the feature flat NHWC,
    ``m`` the mask's storage from ``mask[0, 0, 0, 0]`` (element strides ``m_s*``), ``gm`` grad_mask
    written through ``g_s*``, ``gx`` flat NCHW (``gx_nchw``) or NHWC. Each block row ``by`` within
    ``r`` rows of the span is regrouped once into ``blk [s, sW, C]`` (channels-last, zero tail for
    padded phases); the blocks of the span's own rows get their grad_mask dot products, and every
    block adds ``mask * grad_output`` of its phases to the taps that land on the span's rows
    (``acc``). Every sum has a fixed order and one owner, so no two threads write one element."""
    u = np.uint64
    r = (k - 1) // 2
    cg = c // g
    ss = s * s
    sw = s * w
    sh = s * h
    quads = (ss + 3) // 4
    zero_at = s * sw * c  # c zeros: the source of padded phases
    direct = gy_nhwc and ss % 4 == 0
    blk = np.zeros(0 if direct else zero_at + c, gy.dtype)
    acc = np.empty(min(hi - lo, h) * w * c, gy.dtype)
    wq = np.zeros(4 * k, gy.dtype)
    # per phase (py, px) of a block: its offset in blk from the block's first pixel (padding: the
    # zeros, reached from any block), in the mask and in grad_mask
    ph = np.empty(4 * quads, np.int64)
    ph_m = np.zeros(4 * quads, np.int64)
    ph_g = np.zeros(4 * quads, np.int64)
    for p in range(4 * quads):
        if p < ss:
            ph[p] = ((p // s) * sw + p % s) * c
            ph_m[p] = (p // s) * m_sy + (p % s) * m_sx
            ph_g[p] = (p // s) * g_sy + (p % s) * g_sx
        else:
            ph[p] = -1
    row = lo
    while row < hi:
        n = row // h
        y0 = row % h
        y1 = min(h, y0 + hi - row)
        for i in range((y1 - y0) * w * c):
            acc[u(i)] = 0
        for by in range(max(0, y0 - r), min(h, y1 + r)):
            # the block row's s output rows, channels-last: read in place (NHWC, no padded phases)
            # or regrouped into blk
            row_at = 0
            if direct:
                row_at = (n * sh + by * s) * sw * c
            elif gy_nhwc:
                src_at = (n * sh + by * s) * sw * c
                for i in range(s * sw * c):
                    blk[u(i)] = gy[u(src_at + i)]
            else:
                _rows_channels_last(gy, n * c * sh * sw + by * s * sw, sh * sw, blk, 0, c, s * sw)
            src = gy if direct else blk
            own = by >= y0 and by < y1
            ky_lo = max(0, y0 - by + r)
            ky_hi = min(k, y1 - by + r)
            for bx in range(w):
                kx0 = max(0, r - bx)
                kx1 = min(k, w + r - bx)
                b_at = row_at + bx * s * c
                m_at = n * m_sn + by * s * m_sy + bx * s * m_sx
                g_at = n * g_sn + by * s * g_sy + bx * s * g_sx
                for gi in range(g):
                    ch = gi * cg
                    for q in range(quads):
                        s0 = (b_at + ph[4 * q] if ph[4 * q] >= 0 else zero_at) + ch
                        s1 = (b_at + ph[4 * q + 1] if ph[4 * q + 1] >= 0 else zero_at) + ch
                        s2 = (b_at + ph[4 * q + 2] if ph[4 * q + 2] >= 0 else zero_at) + ch
                        s3 = (b_at + ph[4 * q + 3] if ph[4 * q + 3] >= 0 else zero_at) + ch
                        if own:  # grad_mask of this block's phases (0 for taps off the map)
                            for ky in range(k):
                                iy = by + ky - r
                                row_in = iy >= 0 and iy < h
                                x_row = (n * h + iy) * w + bx - r
                                kx = 0
                                while kx < k:
                                    if row_in and kx >= kx0 and kx + 4 <= kx1:
                                        t = _dots_4x4(src, s0, s1, s2, s3, x, (x_row + kx) * c + ch, c, cg)
                                        for j in range(4):
                                            at = g_at + ((gi * k + ky) * k + kx + j) * g_sc
                                            for e in range(min(4, ss - 4 * q)):
                                                gm[u(at + ph_g[4 * q + e])] = t[4 * j + e]
                                        kx += 4
                                        continue
                                    at = g_at + ((gi * k + ky) * k + kx) * g_sc
                                    for e in range(min(4, ss - 4 * q)):
                                        total = gy.dtype.type(0)
                                        if row_in and kx >= kx0 and kx < kx1:
                                            xb = u((x_row + kx) * c + ch)
                                            sb = u(b_at + ph[4 * q + e] + ch)
                                            for ci in range(u(cg)):
                                                total += src[sb + ci] * x[xb + ci]
                                        gm[u(at + ph_g[4 * q + e])] = total
                                    kx += 1
                        # grad_input: taps of this block landing on the span's rows
                        for ky in range(ky_lo, ky_hi):
                            for kx in range(kx0, kx1):
                                w_at = m_at + ((gi * k + ky) * k + kx) * m_sc
                                for e in range(4):
                                    wq[4 * kx + e] = m[u(w_at + ph_m[4 * q + e])] if ph[4 * q + e] >= 0 else 0
                            iy = by + ky - r
                            acc_at = ((iy - y0) * w + bx - r) * c + ch
                            _scatter_taps(acc, acc_at, c, cg, src, s0, s1, s2, s3, wq, kx0, kx1)
        gx_at = n * c * h * w + y0 * w if gx_nchw else (n * h + y0) * w * c
        _store_rows(acc, y1 - y0, w, c, gx, gx_at, h * w, gx_nchw)
        row += y1 - y0


_backward = njit(_backward, fastmath=REASSOCIATE)


def _to_channels_last(src, dst, c, hw, lo, hi):
    """``dst[n, p, c] = src[n, c, p]`` (flat, contiguous) for the tasks ``[lo, hi)`` of 64 positions."""
    tasks = (hw + 63) // 64
    for task in range(lo, hi):
        n = task // tasks
        p0 = (task % tasks) * 64
        _rows_channels_last(src, n * c * hw + p0, hw, dst, (n * hw + p0) * c, c, min(64, hw - p0))


_to_channels_last = njit(_to_channels_last)
_forward = njit(_forward, fastmath=REASSOCIATE)


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
        _split(_to_channels_last, (numpy_alias(t.view(-1)), flat, c, h * w), n * ((h * w + 63) // 64),
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


def _split(kernel, args, rows, work, min_rows=1):
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
    chunks = min(rows, threads * max(1, min(_CHUNKS_PER_THREAD, rows // (threads * min_rows))))
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
    gy = grad_output.to(acc)
    gy_nhwc = gy.permute(0, 2, 3, 1).is_contiguous()
    if not gy_nhwc:
        gy = gy.contiguous()  # the kernel regroups NCHW rows itself, a block row at a time
    gy_flat = numpy_alias((gy.permute(0, 2, 3, 1) if gy_nhwc else gy).reshape(-1))
    m, (m_sn, m_sc, m_sy, m_sx) = _strided(masks, acc)
    nchw = layout != "NHWC"
    gk = g * k * k
    if nchw:
        gm = new_empty((n, gk, h * s, w * s), acc, features.device)
        gm_flat = numpy_alias(gm.view(-1))
        gx = new_empty((n, c, h, w), acc, features.device)
    else:
        gm_nhwc = new_empty((n, h * s, w * s, gk), acc, features.device)
        gm_flat = numpy_alias(gm_nhwc.view(-1))
        gm = gm_nhwc.permute(0, 3, 1, 2)
        gx = new_empty((n, h, w, c), acc, features.device)
    _split(_backward, (gy_flat, x, m, numpy_alias(gx.view(-1)), gm_flat, n, h, w, c, k, g, s, gy_nhwc,
                       m_sn, m_sc, m_sy, m_sx, *gm.stride(), nchw), n * h, 2 * n * c * h * w * s * s * k * k,
           min_rows=_BACKWARD_ROWS)
    gi = gx if nchw else gx.permute(0, 3, 1, 2)
    return gi.to(features.dtype), gm.to(masks.dtype)
