"""psamask as compiled loops: the ``numba`` backend (see ``_core/dispatch.py``).

The output is written block by block, a tile of planes at a time, into a per-thread staging buffer that
stays in cache; each finished tile streams out whole cache lines at a time (``jit_intrinsics.stream_line``),
so the output (mostly zeros) is written once and never read into the cache. Forward blocks are ``(n, qh)``
of an ``[n, q, p]`` output or ``(n, ph)`` of ``[n, p, q]``; backward blocks ``(n, dh)`` of ``dx [n, d, p]``
(NCHW) or ``(n, ph)`` of ``[n, p, d]`` (NHWC). Each row of a block fixes the mask row ``dh``, so its sources
are one small sheared slab; they are prefetched a row ahead (strided sources into L2 only: the hardware
prefetchers do not follow ~100 strided streams), and the copies stay scalar (``scalar_load``: LLVM's gathers
are slower). Contiguous NCHW maps whose mask does not cover the whole width take the sheared-tile kernels
(``_shear_blocks``): there the row kernels' strided side maps every row to the same cache sets.

Tensors reach the kernels as flat integer views of their storage (raw bits: NaN payloads survive) plus
element strides, so each kernel compiles once per element width. Each output element has one writer, so
the result does not depend on the number of threads.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._core.bits import as_bits, numpy_alias, storage_bits
from ..._core.jit import njit
from ..._core.jit_intrinsics import (STREAMING, prefetch, prefetch_l2, scalar_load, store_fence, stream_line,
                                     transpose8)
from ..._core.layout import empty_nchw
from ..._core.parallel import even_parts, run_parts
from .checks import COLLECT

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_PARALLEL_ELEMENTS = 1 << 18  # below this (~1 MB) a thread hand-off costs more than it saves
CHUNKS_PER_THREAD = 4
CONTIGUOUS_TILE = 8  # planes per tile where the source is contiguous too; strided sources take whole blocks
BACKWARD_TILE = 16  # planes per tile of the NCHW backward: the stage and the dy slabs it reuses stay in cache


def supports(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype in SUPPORTED


# ------------------------------------------------------------------------------------------- kernels
# Every array index below is cast to unsigned: numba wraps signed indices (a negative index counts from
# the end), a per-access test that keeps LLVM from vectorising the fills and slows the copies several-fold.
@njit
def _fill_zero(out, start, stop):
    for i in range(np.uint64(start), np.uint64(stop)):
        out[i] = 0


@njit
def _prefetch_span(a, start, count, stride, line, into_l2):
    """Prefetch ``a[start + i*stride]`` for ``i < count``: one hint per cache line (``line`` elements)
    when the span is contiguous, one per element otherwise; into L2 only when ``into_l2``."""
    if count <= 0:
        return
    if stride == 1 and into_l2:
        for i in range(0, count, line):
            prefetch_l2(a, start + i)
        prefetch_l2(a, start + count - 1)
    elif stride == 1:
        for i in range(0, count, line):
            prefetch(a, start + i)
        prefetch(a, start + count - 1)
    elif into_l2:
        for i in range(count):
            prefetch_l2(a, start + i * stride)
    else:
        for i in range(count):
            prefetch(a, start + i * stride)


@njit
def _prefetch_row(a, base, s_j, jn, s_p, p0, p1, sign, c, kn, line, into_l2):
    """Prefetch the sources of one kernel row: ``a[base + j*s_j + p*s_p]`` for ``0 <= j < jn``,
    ``p0 <= p < p1`` and ``0 <= j + sign*p + c < kn``, walking the axis of smaller stride innermost;
    into L2 only when ``into_l2``."""
    if abs(s_p) <= abs(s_j):
        for j in range(jn):
            if sign > 0:
                lo, hi = max(p0, -c - j), min(p1, kn - c - j)
            else:
                lo, hi = max(p0, j + c - kn + 1), min(p1, j + c + 1)
            _prefetch_span(a, base + j * s_j + lo * s_p, hi - lo, s_p, line, into_l2)
    else:
        for p in range(p0, p1):
            lo, hi = max(0, -c - sign * p), min(jn, kn - c - sign * p)
            _prefetch_span(a, base + p * s_p + lo * s_j, hi - lo, s_j, line, into_l2)


@njit
def _stream_out(dst, start, stop, stage, base, lead, line):
    """``dst[i] = stage[i - base]`` for ``start <= i < stop``: whole cache lines (``i + lead`` a multiple
    of ``line``) as streaming line stores, the partial lines at both ends as plain stores (a partial
    line may hold a neighbouring range's elements)."""
    a = min(stop, start + (line - (start + lead) % line) % line)
    e = max(a, stop - (stop + lead) % line)
    for i in range(start, a):
        dst[np.uint64(i)] = stage[np.uint64(i - base)]
    for i in range(a, e, line):
        stream_line(dst, np.uint64(i), stage, np.uint64(i - base))
    for i in range(e, stop):
        dst[np.uint64(i)] = stage[np.uint64(i - base)]


@njit
def _stage_buffer(out, elements, line):
    """A zeroed per-thread staging buffer of ``elements`` (plus one line) whose element 0 is line-aligned,
    and ``lead``: ``out[i]`` starts a cache line when ``(i + lead) % line == 0``."""
    raw = np.zeros(elements + 2 * line, dtype=out.dtype)
    skip = (line - raw.ctypes.data % 64 // raw.itemsize) % line
    return raw[skip:skip + elements + line], out.ctypes.data % 64 // out.itemsize


@njit
def _forward_tiles(out, x, xo, sn, sdh, sdw, sph, spw, h, w, hm, wm, lo, hi, tile, line, q_major):
    """``out`` (dense) ``[n, qh, qw, ph, pw]`` (``q_major``) or ``[n, ph, pw, qh, qw]`` ``= x[n, qh-ph+hh,
    qw-pw+hw, ph, pw]``, 0 outside the mask: blocks ``b = n*h + o`` in ``[lo, hi)`` (o = qh, or ph), ``tile``
    planes t (qw, or pw) at a time, row r (ph, or qh) by row, each row's sources prefetched a row ahead, into
    a stage (zero-filled first where the tile has cells outside the mask) that then streams out. Row r and
    inner index u are inside the mask for ``o + r0 <= r < o + r0 + hm`` and ``t + u0 <= u < t + u0 + wm``."""
    hh, hw, hwsz = (hm - 1) // 2, (wm - 1) // 2, h * w
    sg, r0, u0 = (-1, hh - hm + 1, hw - wm + 1) if q_major else (1, -hh, -hw)  # dh = sg*(r - o) + hh
    step = spw - sdw if q_major else sdw  # along u
    stage, lead = _stage_buffer(out, tile * hwsz, line)
    for b in range(lo, hi):
        n, o = b // h, b % h
        ra, rb = max(0, o + r0), min(h, o + r0 + hm)
        for t0 in range(0, w, tile):
            t1 = min(w, t0 + tile)
            start, stop = (b * w + t0) * hwsz, (b * w + t1) * hwsz
            base = start - (start + lead) % line  # stage[0] holds out[base], both on line boundaries
            if ra > 0 or rb < h or t1 - 1 + u0 > 0 or t0 + u0 + wm < w:
                _fill_zero(stage, start - base, stop - base)
            for r in range(ra, rb):
                src_row = xo + n * sn + (sg * (r - o) + hh) * sdh + (r if q_major else o) * sph
                if r + 1 < rb and q_major:  # pairs (dw, pw) with qw = dw + pw - hw in the tile
                    _prefetch_row(x, src_row + sph - sdh, sdw, wm, spw, 0, w, 1, -hw - t0, t1 - t0, line, True)
                elif r + 1 < rb:  # pairs (dw, pw), pw in the tile, with qw = dw + pw - hw inside
                    _prefetch_row(x, src_row + sdh, sdw, wm, spw, t0, t1, 1, -hw, w, line, sdw != 1)
                for t in range(t0, t1):
                    a, e = max(0, t + u0), min(w, t + u0 + wm)
                    at = (b * w + t) * hwsz + r * w - base
                    s = src_row + (sg * (a - t) + hw) * sdw + (a if q_major else t) * spw
                    for u in range(a, e):
                        stage[np.uint64(at + u)] = scalar_load(x, np.uint64(s))
                        s += step
            _stream_out(out, start, stop, stage, base, lead, line)
    store_fence()


@njit
def _forward_q_major(out, x, xo, sn, sdh, sdw, sph, spw, h, w, hm, wm, lo, hi, tile, line):
    _forward_tiles(out, x, xo, sn, sdh, sdw, sph, spw, h, w, hm, wm, lo, hi, tile, line, True)


@njit
def _forward_p_major(out, x, xo, sn, sdh, sdw, sph, spw, h, w, hm, wm, lo, hi, tile, line):
    _forward_tiles(out, x, xo, sn, sdh, sdw, sph, spw, h, w, hm, wm, lo, hi, tile, line, False)


@njit
def _prefetch_slab(a, base, s_q, s_p, w, line):
    """Prefetch into L2 the ``w x w`` slab ``a[base + qw*s_q + pw*s_p]`` when one of its axes is
    contiguous (rows of the other are then whole runs of cache lines)."""
    if s_p == 1:
        _prefetch_rows(a, base, s_q, w, w, line, True)
    elif s_q == 1:
        _prefetch_rows(a, base, s_p, w, w, line, True)


@njit
def _d_major_rows(out, shift, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, b, dw0, dw1, line, clear):
    """The valid rows of dx planes ``dw0 <= dw < dw1`` of block ``b = n*hm + dh``, row ``ph`` by row, into
    ``out[i - shift]`` (``i``: the dx index); zeros instead when ``clear``. The first tile of a block prefetches
    the dy slab two rows ahead into L2, where the later tiles find it too."""
    hh, hw, hwsz = (hm - 1) // 2, (wm - 1) // 2, h * w
    step = spw + sqw
    n, dh = b // hm, b % hm
    pa, pb = max(0, hh - dh), min(h, h + hh - dh)  # rows whose qh = ph + dh - hh is inside
    for ph in range(pa, pb):
        src_row = yo + n * sn + (ph + dh - hh) * sqh + ph * sph
        if dw0 == 0 and ph + 2 < pb and not clear:
            _prefetch_slab(dy, src_row + 2 * (sqh + sph), sqw, spw, w, line)
        for dw in range(dw0, dw1):
            a, e = max(0, hw - dw), min(w, w + hw - dw)  # columns whose qw = pw + dw - hw is inside
            o = (b * wm + dw) * hwsz + ph * w - shift
            if clear:
                for pw in range(a, e):
                    out[np.uint64(o + pw)] = 0
            else:
                s = src_row + (dw - hw) * sqw + a * step
                for pw in range(a, e):
                    out[np.uint64(o + pw)] = scalar_load(dy, np.uint64(s))
                    s += step


@njit
def _backward_d_major(dx, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, lo, hi, tile, line):
    """``dx[n, dh, dw, ph, pw]`` (dense) ``= dy[n, ph+dh-hh, pw+dw-hw, ph, pw]``, 0 outside the feature: blocks
    ``b = n*hm + dh``, ``tile`` planes ``dw`` at a time into a zeroed stage, streamed out, whose written rows are
    then zeroed again."""
    hwsz = h * w
    stage, lead = _stage_buffer(dx, tile * hwsz, line)
    for b in range(lo, hi):
        for dw0 in range(0, wm, tile):
            dw1 = min(wm, dw0 + tile)
            start, stop = (b * wm + dw0) * hwsz, (b * wm + dw1) * hwsz
            base = start - (start + lead) % line  # stage[0] holds dx[base], both on line boundaries
            _d_major_rows(stage, base, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, b, dw0, dw1, line, False)
            _stream_out(dx, start, stop, stage, base, lead, line)
            _d_major_rows(stage, base, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, b, dw0, dw1, line, True)
    store_fence()


@njit
def _p_major_rows(out, shift, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, b, pw0, pw1, line, clear):
    """The valid rows of dx planes ``pw0 <= pw < pw1`` of block ``b = n*h + ph``, row ``dh`` by row, as in
    :func:`_d_major_rows`; copies prefetch the next row's sources."""
    hh, hw, msz = (hm - 1) // 2, (wm - 1) // 2, hm * wm
    n, ph = b // h, b % h
    da, db = max(0, hh - ph), min(hm, h + hh - ph)  # rows dh whose qh = ph + dh - hh is inside
    for dh in range(da, db):
        src_row = yo + n * sn + (ph + dh - hh) * sqh + ph * sph
        if dh + 1 < db and not clear:  # pairs (qw, pw), pw in the tile, with dw = qw - pw + hw inside
            _prefetch_row(dy, src_row + sqh, sqw, w, spw, pw0, pw1, -1, hw, wm, line, True)
        for pw in range(pw0, pw1):
            a, e = max(0, hw - pw), min(wm, w + hw - pw)  # columns dw whose qw = pw + dw - hw is inside
            o = (b * w + pw) * msz + dh * wm - shift
            if clear:
                for dw in range(a, e):
                    out[np.uint64(o + dw)] = 0
            else:
                s = src_row + pw * spw + (pw + a - hw) * sqw
                for dw in range(a, e):
                    out[np.uint64(o + dw)] = scalar_load(dy, np.uint64(s))
                    s += sqw


@njit
def _backward_p_major(dx, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, lo, hi, tile, line):
    """``dx[n, ph, pw, dh, dw]`` (dense) ``= dy[n, ph+dh-hh, pw+dw-hw, ph, pw]``: blocks ``b = n*h + ph``,
    ``tile`` planes ``pw`` at a time, as in :func:`_backward_d_major`."""
    msz = hm * wm
    stage, lead = _stage_buffer(dx, tile * msz, line)
    for b in range(lo, hi):
        for pw0 in range(0, w, tile):
            pw1 = min(w, pw0 + tile)
            start, stop = (b * w + pw0) * msz, (b * w + pw1) * msz
            base = start - (start + lead) % line
            _p_major_rows(stage, base, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, b, pw0, pw1, line, False)
            _stream_out(dx, start, stop, stage, base, lead, line)
            _p_major_rows(stage, base, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, b, pw0, pw1, line, True)
    store_fence()


# ------------------------------------------------------------------------------- sheared tiles (NCHW)
# Along W every (mask row, position row) pair is a shear between the slab M[dw, pw] (x or dx) and Q[qw, pw]
# (out or dy): Q[qw, pw] = M[qw - pw + hw, pw]. In NCHW the rows of both lie a plane apart, a power of two at
# network shapes, so a slab walked along the shear keeps evicting its own lines. Here each slab passes once
# through a zero-padded per-thread buffer ``buf[b, j]`` (b = pw), so that every far row is a shifted run of a
# buffer row: ``far[c, b] = buf[b, c + k0 + sgn*b]``. Sides stored with pw innermost move by 8 x 8 register
# transposes (``transpose8``), the others by row copies.


@njit
def _prefetch_rows(a, base, stride, rows, length, line, into_l2=False):
    """Prefetch ``rows`` rows of ``length`` elements at ``base + k*stride`` (one hint per cache line), into
    L2 only when ``into_l2``."""
    for k in range(rows):
        _prefetch_span(a, base + k * stride, length, 1, line, into_l2)


@njit
def _shear_slab(dst, dbase, dstride, dst_rows_c, src, sbase, sstride, src_rows_a,
                buf, stream, pitch, w, b0, b1, na, nc, off, k0, sgn):
    """One chunk ``b0 <= b < b1`` of one slab: ``buf[b - b0, off + a] = near[a, b]`` (``a < na``) from ``src``,
    then ``far[c, b] = buf[b - b0, c + k0 + sgn*b]`` (``c < nc``) to ``dst``. ``src_rows_a``: near rows are
    ``a`` (stride ``sstride``, b innermost) rather than ``b``; ``dst_rows_c`` likewise. Each side's next rows
    are prefetched (a plane apart: the hardware does not follow; near rows of a transpose into L2 only, as they
    share the L1 sets of the rows being read). Near parts outside the band the far side reads are skipped.
    ``stream``: far rows are whole cache lines, so row copies stream."""
    nb = b1 - b0
    line = 64 // dst.itemsize
    nb8, na8, nc8 = nb - nb % 8, na - na % 8, nc - nc % 8
    if src_rows_a:
        for a0 in range(0, na8, 8):
            # the far side reads near[a, b] only where lo <= a - sgn*b < lo + nc: the b range of rows
            # a0..a0+7 (of the next group for the prefetch), relative to b0
            lo = k0 - off
            if sgn > 0:
                ba, bb = a0 - lo - nc + 1 - 7 - b0, a0 + 7 - lo + 1 - b0
            else:
                ba, bb = lo - a0 - 7 - b0, lo + nc - a0 - b0
            pa, pb = max(0, ba + 8 * sgn), min(nb, bb + 8 * sgn)
            if pa < pb:
                _prefetch_rows(src, sbase + (a0 + 8) * sstride + b0 + pa, sstride, min(8, na - a0 - 8), pb - pa,
                               line, True)
            for i in range(max(0, ba) // 8 * 8, min(nb8, bb), 8):
                transpose8(src, sbase + a0 * sstride + b0 + i, sstride, buf, i * pitch + off + a0, pitch)
        for a in range(na8, na):
            for i in range(nb8):
                buf[np.uint64(i * pitch + off + a)] = src[np.uint64(sbase + a * sstride + b0 + i)]
        for a in range(na):
            for i in range(nb8, nb):
                buf[np.uint64(i * pitch + off + a)] = src[np.uint64(sbase + a * sstride + b0 + i)]
    else:
        lo = k0 - off
        for i in range(nb):
            if i + 2 < nb:  # the band of row b0 + i + 2
                pa = max(0, lo + sgn * (b0 + i + 2))
                pb = min(na, lo + nc + sgn * (b0 + i + 2))
                if pa < pb:
                    _prefetch_rows(src, sbase + (b0 + i + 2) * sstride + pa, sstride, 1, pb - pa, line)
            s, t = sbase + (b0 + i) * sstride, i * pitch + off
            for a in range(max(0, lo + sgn * (b0 + i)), min(na, lo + nc + sgn * (b0 + i))):
                buf[np.uint64(t + a)] = src[np.uint64(s + a)]
    shift = k0 + sgn * b0
    if dst_rows_c:
        step = pitch + sgn
        for c0 in range(0, nc8, 8):
            _prefetch_rows(dst, dbase + (c0 + 8) * dstride + b0, dstride, min(8, nc - c0 - 8), nb, line)
            for i in range(0, nb8, 8):
                transpose8(buf, i * step + shift + c0, step, dst, dbase + c0 * dstride + b0 + i, dstride)
        for c in range(nc8, nc):
            for i in range(nb8):
                dst[np.uint64(dbase + c * dstride + b0 + i)] = buf[np.uint64(i * step + shift + c)]
        for c in range(nc):
            for i in range(nb8, nb):
                dst[np.uint64(dbase + c * dstride + b0 + i)] = buf[np.uint64(i * step + shift + c)]
    else:
        for i in range(nb):
            if i + 2 < nb and not stream:
                _prefetch_rows(dst, dbase + (b0 + i + 2) * dstride, dstride, 1, nc, line)
            d, t = dbase + (b0 + i) * dstride, i * (pitch + sgn) + shift
            if stream:
                for c in range(0, nc, line):
                    stream_line(dst, np.uint64(d + c), buf, np.uint64(t + c))
            else:
                for c in range(nc):
                    dst[np.uint64(d + c)] = buf[np.uint64(t + c)]


@njit
def _slab_bases(forward, collect, blk, r, h, w, hm, wm):
    """(valid, near base, far base) of slab ``r`` of block ``blk`` (see :func:`_shear_blocks`)."""
    hh, hwsz = (hm - 1) // 2, h * w
    if forward:
        n, o = blk // h, blk % h
        qh, ph = (o, r) if collect else (r, o)
        dh = qh - ph + hh
        mask_base = ((n * hm + dh) * wm) * hwsz + ph * w
    else:
        n, dh = blk // hm, blk % hm
        ph = r
        qh = ph + dh - hh
        mask_base = ((n * hm + dh) * wm) * hwsz + ph * w
    pos_base = (n * hwsz + (qh * w if collect else ph * w)) * hwsz + (ph if collect else qh) * w
    valid = 0 <= dh < hm and 0 <= qh < h
    return (valid, mask_base, pos_base) if forward else (valid, pos_base, mask_base)


@njit
def _shear_block(out, src, forward, collect, stream, h, w, hm, wm, blk, buf, stage, zero):
    """The slabs of block ``blk`` (see :func:`_shear_blocks`) into ``out``; ``stage``: one far slab's rows
    back to back, ``zero``: one line of zeros."""
    hw, hwsz = (wm - 1) // 2, h * w
    if forward:   # near = x slab [dw, pw], far = out slab [qw, pw]
        na, nc, off = wm, w, max(0, w - 1 - hw)
        k0, sgn = hw + off, -1
        pitch = max(off + na, nc + k0) + 8
    else:         # near = dy slab [qw, pw], far = dx slab [dw, pw]
        na, nc, off = w, wm, hw
        k0, sgn = 0, 1
        pitch = max(off + na, nc + w) + 8
    line = 64 // out.itemsize
    # which index the rows of each side run over: a / c (rows a plane apart, pw innermost) or b = pw
    near_rows_a = forward or collect
    far_rows_c = (not forward) or collect
    for r in range(h):
        valid, sbase, dbase = _slab_bases(forward, collect, blk, r, h, w, hm, wm)
        if valid and stream and far_rows_c:  # transposes into the cached stage, whole rows streamed out
            _shear_slab(stage, 0, w, True, src, sbase, hwsz, near_rows_a,
                        buf, False, pitch, w, 0, w, na, nc, off, k0, sgn)
            for c in range(nc):
                for j in range(0, w, line):
                    stream_line(out, np.uint64(dbase + c * hwsz + j), stage, np.uint64(c * w + j))
        elif valid:
            _shear_slab(out, dbase, hwsz, far_rows_c, src, sbase, hwsz, near_rows_a,
                        buf, stream, pitch, w, 0, w, na, nc, off, k0, sgn)
        else:
            rows, length = (nc, w) if far_rows_c else (w, nc)
            for i in range(rows):
                if stream:
                    for j in range(0, length, line):
                        stream_line(out, np.uint64(dbase + i * hwsz + j), zero, 0)
                else:
                    for j in range(length):
                        out[np.uint64(dbase + i * hwsz + j)] = 0


@njit
def _shear_blocks(dst, src, forward, collect, stream, h, w, hm, wm, lo, hi):
    """Blocks ``[lo, hi)`` of psamask on contiguous NCHW tensors (float views of the raw bits): forward block
    ``n*h + qh`` (COLLECT) or ``n*h + ph`` (DISTRIBUTE), one slab per other row; backward block ``n*hm + dh``
    of dx, one slab per ``ph``; slabs whose mask row is outside the window are zero-filled. With ``stream``
    (output rows are whole cache lines) transposed far sides go through a cached stage and then stream out
    row by row (8 partial lines at a time cannot stream); row copies and zero slabs stream directly."""
    pitch = max(2 * w, wm + w) + 8  # at least either direction's buffer pitch (see _shear_block)
    buf = np.zeros(w * pitch + 16, dtype=dst.dtype)
    line = 64 // dst.itemsize
    stage = np.zeros(max(w, wm) * w + line, dtype=dst.dtype)
    zero = np.zeros(line, dtype=dst.dtype)
    for blk in range(lo, hi):
        _shear_block(dst, src, forward, collect, stream, h, w, hm, wm, blk, buf, stage, zero)
    store_fence()


# ------------------------------------------------------------------------------------------- driver
def _launch(kernel, tile, out: torch.Tensor, src: torch.Tensor, strides, h, w, hm, wm, blocks: int) -> None:
    out_bits, src_bits = storage_bits(out), storage_bits(src)
    args = (out_bits, src_bits, src.storage_offset(), *strides, h, w, hm, wm)
    tail = (max(1, tile), 64 // out.element_size())  # planes per tile, elements per cache line
    _split(kernel, args, tail, blocks, out.numel())


def _split(kernel, args, tail, blocks: int, elements: int) -> None:
    """``kernel(*args, lo, hi, *tail)`` over the blocks ``[0, blocks)``, split over the thread pool (one part
    below ``_PARALLEL_ELEMENTS``; ``run_parts`` runs one part, or any on one thread, on the calling thread)."""
    chunks = torch.get_num_threads() * CHUNKS_PER_THREAD if elements >= _PARALLEL_ELEMENTS else 1
    run_parts(lambda lo, hi: kernel(*args, lo, hi, *tail), even_parts(blocks, chunks))


_FLOAT_OF_WIDTH = {4: np.float32, 8: np.float64}  # transpose8's element types, used as raw-bit carriers


def _sheared(t: torch.Tensor, layout: str, w: int, w_mask: int) -> bool:
    """Whether the sheared-tile kernel takes this call: contiguous NCHW, 4- or 8-byte elements, W >= 8 and a
    mask that does not cover the whole width from every position (where it does, as at PSANet's training
    shapes, the row kernels are faster both ways)."""
    hw = (w_mask - 1) // 2
    covers = hw >= w - 1 and w_mask - 1 - hw >= w - 1
    return (layout == "NCHW" and t.is_contiguous() and t.element_size() in _FLOAT_OF_WIDTH and w >= 8
            and not covers)


def _flat(t: torch.Tensor) -> np.ndarray:
    """A contiguous tensor's elements as a flat float array of the same width (its raw bits)."""
    return numpy_alias(as_bits(t).reshape(-1)).view(_FLOAT_OF_WIDTH[t.element_size()])


def _launch_sheared(out, src, is_forward, collect, h, w, hm, wm, blocks):
    stream = STREAMING and out.data_ptr() % 64 == 0 and (w * out.element_size()) % 64 == 0  # whole lines
    _split(_shear_blocks, (_flat(out), _flat(src), is_forward, collect, stream, h, w, hm, wm), (),
           blocks, out.numel())


def forward(x: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str, out=None) -> torch.Tensor:
    """x: logical NCHW ``[N, h_mask*w_mask, H, W]`` -> logical NCHW ``[N, H*W, H, W]`` stored in ``layout``
    (``out`` when given: every element is written)."""
    n, _, h, w = x.shape
    out = empty_nchw((n, h * w, h, w), layout, like=x) if out is None else out
    if _sheared(x, layout, w, w_mask):
        _launch_sheared(out, x, True, psa_type == COLLECT, h, w, h_mask, w_mask, n * h)
        return out
    sn, sc, sh, sw = x.stride()
    q_major = (psa_type == COLLECT) == (layout == "NCHW")  # storage [n, q, p] rather than [n, p, q]
    kernel = _forward_q_major if q_major else _forward_p_major
    tile = CONTIGUOUS_TILE if sc == 1 and not q_major else w
    _launch(kernel, tile, out, x, (sn, w_mask * sc, sc, sh, sw), h, w, h_mask, w_mask, n * h)
    return out


def backward(dy: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str, out=None) -> torch.Tensor:
    """dy: logical NCHW ``[N, H*W, H, W]`` -> dx logical NCHW ``[N, h_mask*w_mask, H, W]`` (``out`` when given)."""
    n, _, h, w = dy.shape
    dx = empty_nchw((n, h_mask * w_mask, h, w), layout, like=dy) if out is None else out
    if _sheared(dy, layout, w, w_mask):
        _launch_sheared(dx, dy, False, psa_type == COLLECT, h, w, h_mask, w_mask, n * h_mask)
        return dx
    sn, sc, sh, sw = dy.stride()
    # COLLECT: the channel holds q, the spatial axes p; DISTRIBUTE the other way round
    strides = (sn, w * sc, sc, sh, sw) if psa_type == COLLECT else (sn, sh, sw, w * sc, sc)
    if layout == "NCHW":
        _launch(_backward_d_major, BACKWARD_TILE, dx, dy, strides, h, w, h_mask, w_mask, n * h_mask)
    else:
        tile = CONTIGUOUS_TILE if strides[2] == 1 else w
        _launch(_backward_p_major, tile, dx, dy, strides, h, w, h_mask, w_mask, n * h)
    return dx
