"""CARAFE as compiled loops: the ``numba`` backend (see ``_core/dispatch.py``).

Why: CARAFE is ``k*k`` multiply-adds per output element with a different weight matrix per output
pixel, which torch (``cpu.py``) can only run as many tiny products, far below the machine's FLOP rate.
Here the innermost loops run over channels, contiguous in channels-last rows, so LLVM vectorises
them; a block's ``s x s`` sub-pixel phases read the same taps, so the loops take four phases at a time
and load each tap vector once for all four.

* forward (per input row): the ``s`` output rows accumulate in a row buffer ``[s, sW, C]`` (an NHWC
  output's own rows where its phases fill whole quads), stored in the output's layout.
* backward (per span of input rows, one kernel for both gradients): each block row of ``grad_output``
  near the span is read once; the span's own blocks get their grad_mask dot products, and every block
  spreads ``mask * grad_output`` over its taps on the span's rows (taps inside the map only, as in the
  reference), so grad_input is gathered by the thread that owns each input row: no races.

NCHW tensors are never copied whole: rows are regrouped channels-last (a ring of ``k`` feature rows)
with 8 x 8 register transposes while they are in cache. Every output element has one writer and a sum
order fixed at compile time, so results do not depend on the thread count.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._core.bits import numpy_alias
from ..._core.jit import REASSOCIATE, inline, njit
from ..._core.jit_intrinsics import transpose8
from ..._core.layout import as_nchw, stored_shape
from ..._core.memory import new_empty
from ..._core.parallel import even_parts, guided_parts, run_parts
from .cpu import acc_dtype

_LANES = 8  # transpose8's block
# multiply-adds below which one thread runs the call: a helper thread saves little there, and costs more
# where it shares its core (e.g. with torch's OpenMP workers, which spin for a while after a parallel op)
_PARALLEL_WORK = 2e7
# the NCHW forward also transposes every row in and out, so splitting it pays from half that
_PARALLEL_WORK_NCHW_FORWARD = 1e7
_CHUNKS_PER_THREAD = 8
# input rows per span at least: each span regroups the r rows beyond its ends again (NCHW features,
# and grad_output's block rows in the backward). The forward's spans shrink towards the end (guided):
# this is the last ones' length.
_FORWARD_ROWS = 2
_BACKWARD_ROWS = 12


def supports(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype.is_floating_point for t in tensors)


# ------------------------------------------------------------------------------------------- kernels
@inline
def _planes_transpose(planes, p_at, plane, cl, c_at, channels, count, to_planes):
    """``planes[p_at + c*plane + p]`` (an NCHW run of positions) and ``cl[c_at + p*C + c]`` (channels-last)
    for ``p < count``, ``c < C``: copied into ``planes`` (``to_planes``) or into ``cl``, through 8 x 8
    register transposes, eight planes at a time (eight sequential streams in the planes). Ragged edges
    take one more block overlapping the previous one (the same values written twice), so only runs
    of fewer than eight channels or positions go element by element."""
    u = np.uint64
    if channels < _LANES or count < _LANES:
        for ci in range(channels):
            for p in range(count):
                if to_planes:
                    planes[u(p_at + ci * plane + p)] = cl[u(c_at + p * channels + ci)]
                else:
                    cl[u(c_at + p * channels + ci)] = planes[u(p_at + ci * plane + p)]
        return
    for c in range(0, channels, _LANES):
        c0 = min(c, channels - _LANES)
        if to_planes:
            for p in range(0, count, _LANES):
                p0 = min(p, count - _LANES)
                transpose8(cl, c_at + p0 * channels + c0, channels, planes, p_at + c0 * plane + p0, plane)
        else:
            for p in range(0, count, _LANES):
                p0 = min(p, count - _LANES)
                transpose8(planes, p_at + c0 * plane + p0, plane, cl, c_at + p0 * channels + c0, channels)


@inline
def _store_rows(buf, count, channels, out, out_at, plane, nchw):
    """Channels-last ``buf [count, C]`` -> ``count`` consecutive positions of the output from ``out_at``:
    NHWC ``out[out_at + p*C + c]``, NCHW ``out[out_at + c*plane + p]``."""
    u = np.uint64
    if nchw:
        _planes_transpose(out, out_at, plane, buf, 0, channels, count, True)
        return
    base = u(out_at)
    for i in range(u(count * channels)):
        out[base + i] = buf[i]


@inline
def _ring_rows(x, ring, n, c, h, w, k, iy0, iy1):
    """Feature rows ``[iy0, iy1)`` of image ``n`` (contiguous NCHW ``x``) regrouped channels-last into
    ``ring`` slot ``iy % k``: the ``k`` rows a window reads are always in distinct slots."""
    for iy in range(iy0, iy1):
        _planes_transpose(x, (n * c * h + iy) * w, h * w, ring, (iy % k) * w * c, c, w, False)


@inline
def _phases(s, quads, c, row, m_sy, m_sx, o_sy, o_sx):
    """Offsets of the sub-pixel phases ``p = py*s + px`` of a block, padded to whole quads: in the
    channels-last block row (``row`` elements a row; -1 for padding), in the mask and in a second
    strided tensor."""
    ph = np.full(4 * quads, -1, np.int64)
    ph_m = np.zeros(4 * quads, np.int64)
    ph_o = np.zeros(4 * quads, np.int64)
    for p in range(s * s):
        ph[p] = (p // s) * row + (p % s) * c
        ph_m[p] = (p // s) * m_sy + (p % s) * m_sx
        ph_o[p] = (p // s) * o_sy + (p % s) * o_sx
    return ph, ph_m, ph_o


@inline
def _quad_weights(wq, m, m_at, m_sc, ph, ph_m, q, kx0, kx1):
    """``wq[4*kx + e] = mask`` of phase ``4*q + e`` at tap ``kx`` (0 for padded phases)."""
    u = np.uint64
    for kx in range(kx0, kx1):
        for e in range(4):
            p = 4 * q + e
            wq[4 * kx + e] = m[u(m_at + kx * m_sc + ph_m[p])] if ph[p] >= 0 else 0


@inline
def _gather_taps(acc, a0, a1, a2, a3, src, src_at, src_step, m, m_at, m_sc, o0, o1, o2, o3, t0, t1, count):
    """``acc[a_j + i] += sum_t m[m_at + t*m_sc + o_j] * src[src_at + t*src_step + i]`` for
    ``t0 <= t < t1``, ``i < count``: four sub-pixel phases of one block (mask offsets ``o_j``)
    accumulate the block's taps, five taps a pass (each pass loads five tap vectors once for all four
    phases, 20 multiply-adds). The vector loop covers whole 16-lane blocks, and the ragged channels
    read the weights again, so no scalar copy of them stays live through the loop."""
    u = np.uint64
    p0, p1, p2, p3 = u(a0), u(a1), u(a2), u(a3)
    full = u(count - count % 16)
    t = t0
    while t + 5 <= t1:
        m0 = m_at + t * m_sc
        m1, m2, m3, m4 = m0 + m_sc, m0 + 2 * m_sc, m0 + 3 * m_sc, m0 + 4 * m_sc
        w00, w01, w02, w03 = m[u(m0 + o0)], m[u(m0 + o1)], m[u(m0 + o2)], m[u(m0 + o3)]
        w10, w11, w12, w13 = m[u(m1 + o0)], m[u(m1 + o1)], m[u(m1 + o2)], m[u(m1 + o3)]
        w20, w21, w22, w23 = m[u(m2 + o0)], m[u(m2 + o1)], m[u(m2 + o2)], m[u(m2 + o3)]
        w30, w31, w32, w33 = m[u(m3 + o0)], m[u(m3 + o1)], m[u(m3 + o2)], m[u(m3 + o3)]
        w40, w41, w42, w43 = m[u(m4 + o0)], m[u(m4 + o1)], m[u(m4 + o2)], m[u(m4 + o3)]
        b0 = u(src_at + t * src_step)
        b1 = u(src_at + (t + 1) * src_step)
        b2 = u(src_at + (t + 2) * src_step)
        b3 = u(src_at + (t + 3) * src_step)
        b4 = u(src_at + (t + 4) * src_step)
        for i in range(full):
            v0 = src[b0 + i]
            v1 = src[b1 + i]
            v2 = src[b2 + i]
            v3 = src[b3 + i]
            v4 = src[b4 + i]
            acc[p0 + i] += w00 * v0 + w10 * v1 + w20 * v2 + w30 * v3 + w40 * v4
            acc[p1 + i] += w01 * v0 + w11 * v1 + w21 * v2 + w31 * v3 + w41 * v4
            acc[p2 + i] += w02 * v0 + w12 * v1 + w22 * v2 + w32 * v3 + w42 * v4
            acc[p3 + i] += w03 * v0 + w13 * v1 + w23 * v2 + w33 * v3 + w43 * v4
        for i in range(full, u(count)):
            v0 = src[b0 + i]
            v1 = src[b1 + i]
            v2 = src[b2 + i]
            v3 = src[b3 + i]
            v4 = src[b4 + i]
            for j in range(4):
                o = o0 if j == 0 else o1 if j == 1 else o2 if j == 2 else o3
                acc[u(a0 if j == 0 else a1 if j == 1 else a2 if j == 2 else a3) + i] += (
                    m[u(m0 + o)] * v0 + m[u(m1 + o)] * v1 + m[u(m2 + o)] * v2 + m[u(m3 + o)] * v3 + m[u(m4 + o)] * v4)
        t += 5
    while t < t1:
        m0 = m_at + t * m_sc
        w00, w01, w02, w03 = m[u(m0 + o0)], m[u(m0 + o1)], m[u(m0 + o2)], m[u(m0 + o3)]
        b0 = u(src_at + t * src_step)
        for i in range(u(count)):
            v0 = src[b0 + i]
            acc[p0 + i] += w00 * v0
            acc[p1 + i] += w01 * v0
            acc[p2 + i] += w02 * v0
            acc[p3 + i] += w03 * v0
        t += 1


@inline
def _scatter_taps(acc, acc_at, acc_step, count, src, s0, s1, s2, s3, wq, t0, t1):
    """``acc[acc_at + t*acc_step + i] += sum_j wq[4*t + j] * src[s_j + i]`` for ``t0 <= t < t1``,
    ``i < count``: four sub-pixel phases of one block spread over its taps, two taps a pass (each
    pass loads the four phase vectors once for two accumulators)."""
    u = np.uint64
    a0, a1, a2, a3 = u(s0), u(s1), u(s2), u(s3)
    t = t0
    while t < t1:
        f = 4 * t
        w0, w1, w2, w3 = wq[f], wq[f + 1], wq[f + 2], wq[f + 3]
        b = u(acc_at + t * acc_step)
        if t + 2 <= t1:
            v0, v1, v2, v3 = wq[f + 4], wq[f + 5], wq[f + 6], wq[f + 7]
            d = u(acc_at + (t + 1) * acc_step)
            for i in range(u(count)):
                g0 = src[a0 + i]
                g1 = src[a1 + i]
                g2 = src[a2 + i]
                g3 = src[a3 + i]
                acc[b + i] += w0 * g0 + w1 * g1 + w2 * g2 + w3 * g3
                acc[d + i] += v0 * g0 + v1 * g1 + v2 * g2 + v3 * g3
            t += 2
        else:
            for i in range(u(count)):
                acc[b + i] += w0 * src[a0 + i] + w1 * src[a1 + i] + w2 * src[a2 + i] + w3 * src[a3 + i]
            t += 1


@inline
def _dots_4x5(out, src, s0, s1, s2, s3, x, x_at, x_step, t0, t1, count):
    """``out[4*t + j]`` = the dot product of the phase vector ``src[s_j:][:count]`` with the tap
    vector ``x[x_at + (t0 + t)*x_step:][:count]`` for ``t < 5``: 20 products from 9 loads per lane
    block. Taps at or past ``t1`` repeat tap ``t1 - 1`` (in range; their products are not used)."""
    u = np.uint64
    a0, a1, a2, a3 = u(s0), u(s1), u(s2), u(s3)
    last = t1 - 1
    b0 = u(x_at + t0 * x_step)
    b1 = u(x_at + min(t0 + 1, last) * x_step)
    b2 = u(x_at + min(t0 + 2, last) * x_step)
    b3 = u(x_at + min(t0 + 3, last) * x_step)
    b4 = u(x_at + min(t0 + 4, last) * x_step)
    z = src.dtype.type(0)
    r00 = r01 = r02 = r03 = r10 = r11 = r12 = r13 = r20 = r21 = z
    r22 = r23 = r30 = r31 = r32 = r33 = r40 = r41 = r42 = r43 = z
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
        v = x[b4 + i]
        r40 += g0 * v
        r41 += g1 * v
        r42 += g2 * v
        r43 += g3 * v
    out[0], out[1], out[2], out[3] = r00, r01, r02, r03
    out[4], out[5], out[6], out[7] = r10, r11, r12, r13
    out[8], out[9], out[10], out[11] = r20, r21, r22, r23
    out[12], out[13], out[14], out[15] = r30, r31, r32, r33
    out[16], out[17], out[18], out[19] = r40, r41, r42, r43


def _forward(x, m, out, h, w, c, k, g, s, x_nhwc, m_sn, m_sc, m_sy, m_sx, nchw, lo, hi):
    """Output rows of the input rows ``[lo, hi)`` (``n*H + y``). ``x``: the features flat NHWC (``x_nhwc``)
    or contiguous NCHW (regrouped into the ring), ``m``: the mask's storage from ``mask[0, 0, 0, 0]``
    (element strides ``m_s*``), ``out``: flat NCHW (``nchw``) or NHWC. Padded phases (weighted by phase 0's
    mask) accumulate in a scratch tail of ``buf`` that is never read."""
    u = np.uint64
    r = (k - 1) // 2
    cg = c // g
    sw = s * w
    quads = (s * s + 3) // 4
    scratch = s * sw * c
    direct = not nchw and s * s % 4 == 0
    buf = np.empty(0 if direct else scratch + c, x.dtype)
    acc = out if direct else buf
    ring = np.empty(0 if x_nhwc else k * w * c, x.dtype)
    xs = x if x_nhwc else ring
    ph, ph_m, _ = _phases(s, quads, c, sw * c, m_sy, m_sx, 0, 0)
    for row in range(lo, hi):
        n = row // h
        y = row % h
        if not x_nhwc:
            _ring_rows(x, ring, n, c, h, w, k, max(0, y - r) if row == lo or y == 0 else y + r, min(h, y + r + 1))
        out_at = (n * c * s * h + y * s) * sw if nchw else (n * s * h + y * s) * sw * c
        acc_at = out_at if direct else 0
        for i in range(u(scratch)):
            acc[u(acc_at) + i] = 0
        for xx in range(w):
            kx0 = max(0, r - xx)
            kx1 = min(k, w + r - xx)
            b_at = acc_at + xx * s * c
            for gi in range(g):
                ch = gi * cg
                for q in range(quads):
                    a0 = (b_at + ph[4 * q] if ph[4 * q] >= 0 else scratch) + ch
                    a1 = (b_at + ph[4 * q + 1] if ph[4 * q + 1] >= 0 else scratch) + ch
                    a2 = (b_at + ph[4 * q + 2] if ph[4 * q + 2] >= 0 else scratch) + ch
                    a3 = (b_at + ph[4 * q + 3] if ph[4 * q + 3] >= 0 else scratch) + ch
                    o0, o1, o2, o3 = ph_m[4 * q], ph_m[4 * q + 1], ph_m[4 * q + 2], ph_m[4 * q + 3]
                    for ky in range(max(0, r - y), min(k, h + r - y)):
                        iy = y + ky - r
                        x_at = (((n * h + iy) * w if x_nhwc else (iy % k) * w) + xx - r) * c + ch
                        m_at = n * m_sn + y * s * m_sy + xx * s * m_sx + (gi * k + ky) * k * m_sc
                        _gather_taps(acc, a0, a1, a2, a3, xs, x_at, c, m, m_at, m_sc, o0, o1, o2, o3, kx0, kx1, cg)
        if not direct:
            _store_rows(buf, s * sw, c, out, out_at, s * h * sw, nchw)


def _backward(gy, x, m, gx, gm, h, w, c, k, g, s, gy_nhwc, x_nhwc, m_sn, m_sc, m_sy, m_sx,
              g_sn, g_sc, g_sy, g_sx, gx_nchw, lo, hi):
    """Both gradients of the input rows ``[lo, hi)`` (``n*H + y``) and of their blocks. ``gy``: grad_output
    flat NHWC (``gy_nhwc``) or contiguous NCHW, ``x`` and ``m`` as in :func:`_forward`, ``gm``: grad_mask
    through its strides ``g_s*``, ``gx``: flat NCHW (``gx_nchw``) or NHWC. Each block row within ``r`` rows
    of the span is read once, in place (NHWC, whole quads) or regrouped into ``blk`` (a zero tail for padded
    phases)."""
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
    ring = np.empty(0 if x_nhwc else k * w * c, gy.dtype)
    xs = x if x_nhwc else ring
    acc = np.empty(min(hi - lo, h) * w * c, gy.dtype)
    wq = np.zeros(4 * k, gy.dtype)
    dq = np.empty(20, gy.dtype)
    ph, ph_m, ph_g = _phases(s, quads, c, sw * c, m_sy, m_sx, g_sy, g_sx)
    row = lo
    while row < hi:
        n = row // h
        y0 = row % h
        y1 = min(h, y0 + hi - row)
        for i in range(u((y1 - y0) * w * c)):
            acc[i] = 0
        for by in range(max(0, y0 - r), min(h, y1 + r)):
            row_at = 0
            if direct:
                row_at = (n * sh + by * s) * sw * c
            elif gy_nhwc:
                src_at = (n * sh + by * s) * sw * c
                for i in range(u(s * sw * c)):
                    blk[i] = gy[u(src_at) + i]
            else:
                _planes_transpose(gy, n * c * sh * sw + by * s * sw, sh * sw, blk, 0, c, s * sw, False)
            src = gy if direct else blk
            own = by >= y0 and by < y1
            if own and not x_nhwc:
                _ring_rows(x, ring, n, c, h, w, k, max(0, by - r) if by == y0 else by + r, min(h, by + r + 1))
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
                        phases = min(4, ss - 4 * q)
                        if own:  # grad_mask of this block's phases (0 for taps off the map)
                            for ky in range(k):
                                iy = by + ky - r
                                row_in = iy >= 0 and iy < h
                                t_at = g_at + (gi * k + ky) * k * g_sc
                                for kx in range(k):
                                    if not row_in or kx < kx0 or kx >= kx1:
                                        for e in range(phases):
                                            gm[u(t_at + kx * g_sc + ph_g[4 * q + e])] = 0
                                if not row_in:
                                    continue
                                x_at = (((n * h + iy) * w if x_nhwc else (iy % k) * w) + bx - r) * c + ch
                                for kx in range(kx0, kx1, 5):
                                    _dots_4x5(dq, src, s0, s1, s2, s3, xs, x_at, c, kx, kx1, cg)
                                    for j in range(min(5, kx1 - kx)):
                                        for e in range(phases):
                                            gm[u(t_at + (kx + j) * g_sc + ph_g[4 * q + e])] = dq[4 * j + e]
                        # grad_input: taps of this block landing on the span's rows
                        for ky in range(max(0, y0 - by + r), min(k, y1 - by + r)):
                            _quad_weights(wq, m, m_at + (gi * k + ky) * k * m_sc, m_sc, ph, ph_m, q, kx0, kx1)
                            acc_at = ((by + ky - r - y0) * w + bx - r) * c + ch
                            _scatter_taps(acc, acc_at, c, cg, src, s0, s1, s2, s3, wq, kx0, kx1)
        gx_at = n * c * h * w + y0 * w if gx_nchw else (n * h + y0) * w * c
        _store_rows(acc, (y1 - y0) * w, c, gx, gx_at, h * w, gx_nchw)
        row += y1 - y0


_forward = njit(_forward, fastmath=REASSOCIATE)
_backward = njit(_backward, fastmath=REASSOCIATE)


# ------------------------------------------------------------------------------------------- entry
def _dense(t: torch.Tensor, acc: torch.dtype):
    """Logical-NCHW ``t`` in ``acc`` as a flat array of its channels-last storage (``True``) or of a
    contiguous NCHW copy or view (``False``): the kernels regroup NCHW rows themselves, in cache."""
    t = t.to(acc)
    if t.permute(0, 2, 3, 1).is_contiguous():
        return numpy_alias(t.permute(0, 2, 3, 1).reshape(-1)), True
    return numpy_alias(t.contiguous().view(-1)), False


def _strided(t: torch.Tensor, acc: torch.dtype):
    """``t`` in ``acc`` as its storage from ``t[0, 0, 0, 0]`` and its element strides (no copy when
    ``t`` is already ``acc``)."""
    t = t.to(acc)
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    flat = torch.as_strided(t, (span,), (1,), t.storage_offset())
    return numpy_alias(flat), t.stride()


def _new(shape_nchw, layout: str, acc: torch.dtype):
    """A new ``acc`` tensor stored contiguously in ``layout``: its logical NCHW view and its flat storage."""
    t = new_empty(stored_shape(shape_nchw, layout), acc)
    return as_nchw(t, layout), numpy_alias(t.view(-1))


def _split(kernel, args, rows, work, min_rows=1, guided=False, threshold=_PARALLEL_WORK):
    """``kernel(*args, lo, hi)`` over the rows ``[0, rows)``: on the calling thread below ``threshold``, else in
    chunks that the caller and the shared worker threads claim one by one (``_core.parallel.run_parts``):
    even ones of at least ``min_rows`` rows, or guided ones down to ``min_rows``. The kernels release
    the GIL."""
    threads = torch.get_num_threads()
    if threads < 2 or rows < 2 or work < threshold:
        kernel(*args, 0, rows)
        return
    if guided:
        parts = guided_parts(rows, threads, min_rows)
    else:
        parts = even_parts(rows, threads * max(1, min(_CHUNKS_PER_THREAD, rows // (threads * min_rows))))
    run_parts(lambda lo, hi: kernel(*args, lo, hi), parts)


def forward(features, masks, kernel_size, group_size, scale_factor, layout="NCHW"):
    """Same contract as ``cpu.forward``."""
    n, c, h, w = features.shape
    k, g, s = kernel_size, group_size, scale_factor
    acc = acc_dtype(features.dtype)
    x, x_nhwc = _dense(features, acc)
    m, (m_sn, m_sc, m_sy, m_sx) = _strided(masks, acc)
    nchw = layout != "NHWC"
    out, out_flat = _new((n, c, h * s, w * s), layout, acc)
    _split(_forward, (x, m, out_flat, h, w, c, k, g, s, x_nhwc, m_sn, m_sc, m_sy, m_sx, nchw),
           n * h, n * c * h * w * s * s * k * k, min_rows=_FORWARD_ROWS, guided=True,
           threshold=_PARALLEL_WORK_NCHW_FORWARD if nchw else _PARALLEL_WORK)
    return out.to(features.dtype)


def backward(grad_output, features, masks, kernel_size, group_size, scale_factor, layout="NCHW"):
    """Same contract as ``cpu.backward``."""
    n, c, h, w = features.shape
    k, g, s = kernel_size, group_size, scale_factor
    acc = acc_dtype(features.dtype)
    x, x_nhwc = _dense(features, acc)
    gy, gy_nhwc = _dense(grad_output, acc)
    m, (m_sn, m_sc, m_sy, m_sx) = _strided(masks, acc)
    gx, gx_flat = _new((n, c, h, w), layout, acc)
    gm, gm_flat = _new((n, g * k * k, h * s, w * s), layout, acc)
    args = (gy, x, m, gx_flat, gm_flat, h, w, c, k, g, s, gy_nhwc, x_nhwc, m_sn, m_sc, m_sy, m_sx, *gm.stride(),
            layout != "NHWC")
    _split(_backward, args, n * h, 2 * n * c * h * w * s * s * k * k, min_rows=_BACKWARD_ROWS)
    return gx.to(features.dtype), gm.to(masks.dtype)
