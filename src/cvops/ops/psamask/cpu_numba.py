"""psamask as compiled loops: the CPU fast path when numba is installed (see ``_core/jit.py``).

Why: the strided copies of ``cpu.py`` pay per element for the shear ``q = p + d - half``, which gives one
side of every copy a non-unit inner stride, and its backward streams most of ``dx`` through memory
twice. Here the output is written block by block in its storage order, each block finished while it is
still in cache:

* forward, output ``[n, q, p]`` (COLLECT NCHW, DISTRIBUTE NHWC) or ``[n, p, q]`` (DISTRIBUTE NCHW,
  COLLECT NHWC): one block per ``(n, qh)`` or ``(n, ph)``, walked row by row (``ph`` or ``qh``); each
  row fixes the mask row ``dh``, so its sources are one small sheared slab of ``x``.
* backward, ``dx [n, d, p]`` (NCHW) or ``[n, p, d]`` (NHWC): one block per ``(n, dh)`` or ``(n, ph)``,
  zero-filled in one pass, then the valid rows written while the block is still in cache.

What makes it fast:
* the sources of the next row are prefetched (``jit_intrinsics.prefetch``): with a strided source each
  element sits on its own cache line, and the hardware prefetchers do not follow ~100 such streams;
* the kernels compile without LLVM's loop vectoriser (``jit_intrinsics.compile_scalar``): it turns the
  strided loops into AVX-512 gathers, slower than scalar loads on AMD CPUs;
* array indices are unsigned (no negative-index wrap test per access).

Tensors reach the kernels as flat integer views of their storage (raw bits: every dtype is copied
exactly, NaN payloads included) plus element strides of the logical ``[n, mask/position axes]`` view,
so each kernel compiles once per element width whatever the layout or strides. Blocks are independent
and each output element has one writer, so the result does not depend on the number of threads.
"""
from __future__ import annotations

import numba
import numpy as np
import torch

from ..._core.bits import storage_bits
from ..._core.jit import njit
from ..._core.jit_intrinsics import compile_scalar, prefetch
from ..._core.layout import empty_nchw
from ..._core.parallel import pool
from .checks import COLLECT

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_PARALLEL_ELEMENTS = 1 << 18  # below this (~1 MB) a thread hand-off costs more than it saves
CHUNKS_PER_THREAD = 4
# Planes written together (see the kernels). Rows whose source is contiguous too (the copy is a memcpy)
# want a small tile; strided sources want whole blocks, so one prefetch pass covers each row.
CONTIGUOUS_TILE = 8


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
def _prefetch_span(a, start, count, stride, line):
    """Prefetch ``a[start + i*stride]`` for ``i < count``: one hint per cache line (``line`` elements)
    when the span is contiguous, one per element otherwise."""
    if count <= 0:
        return
    if stride == 1:
        for i in range(0, count, line):
            prefetch(a, start + i)
        prefetch(a, start + count - 1)
    else:
        for i in range(count):
            prefetch(a, start + i * stride)


@njit
def _prefetch_row(a, base, s_j, jn, s_p, p0, p1, sign, c, kn, line):
    """Prefetch the sources of one kernel row: ``a[base + j*s_j + p*s_p]`` for ``0 <= j < jn``,
    ``p0 <= p < p1`` and ``0 <= j + sign*p + c < kn``, walking the axis of smaller stride innermost."""
    if abs(s_p) <= abs(s_j):
        for j in range(jn):
            if sign > 0:
                lo, hi = max(p0, -c - j), min(p1, kn - c - j)
            else:
                lo, hi = max(p0, j + c - kn + 1), min(p1, j + c + 1)
            _prefetch_span(a, base + j * s_j + lo * s_p, hi - lo, s_p, line)
    else:
        for p in range(p0, p1):
            lo, hi = max(0, -c - sign * p), min(jn, kn - c - sign * p)
            _prefetch_span(a, base + p * s_p + lo * s_j, hi - lo, s_j, line)


@njit
def _forward_q_major(out, x, xo, sn, sdh, sdw, sph, spw, h, w, hm, wm, lo, hi, tile, line):
    """``out[n, qh, qw, ph, pw]`` (dense) ``= x[n, qh-ph+hh, qw-pw+hw, ph, pw]``, 0 outside the mask.

    Blocks ``b = n*h + qh`` in ``[lo, hi)``; in each, ``tile`` planes ``qw`` at a time, row ``ph`` by
    row (one mask row ``dh`` per row), prefetching the next row's sources."""
    hh, hw, hwsz = (hm - 1) // 2, (wm - 1) // 2, h * w
    step = spw - sdw
    for b in range(lo, hi):
        n, qh = b // h, b % h
        pa, pb = max(0, qh + hh - hm + 1), min(h, qh + hh + 1)  # rows ph whose dh = qh - ph + hh is inside
        for qw0 in range(0, w, tile):
            qw1 = min(w, qw0 + tile)
            # columns pw whose dw = qw - pw + hw is inside: [max(0, qw+hw-wm+1), min(w, qw+hw+1))
            if pa > 0 or pb < h or qw1 + hw - wm > 0 or qw0 + hw + 1 < w:
                _fill_zero(out, (b * w + qw0) * hwsz, (b * w + qw1) * hwsz)
            for ph in range(pa, pb):
                src_row = xo + n * sn + (qh - ph + hh) * sdh + ph * sph
                if ph + 1 < pb:  # pairs (dw, pw) with qw = dw + pw - hw in the tile
                    _prefetch_row(x, src_row + sph - sdh, sdw, wm, spw, 0, w, 1, -hw - qw0, qw1 - qw0, line)
                for qw in range(qw0, qw1):
                    a, e = max(0, qw + hw - wm + 1), min(w, qw + hw + 1)
                    o = (b * w + qw) * hwsz + ph * w
                    s = src_row + (qw + hw) * sdw + a * step
                    for pw in range(a, e):
                        out[np.uint64(o + pw)] = x[np.uint64(s)]
                        s += step


@njit
def _forward_p_major(out, x, xo, sn, sdh, sdw, sph, spw, h, w, hm, wm, lo, hi, tile, line):
    """``out[n, ph, pw, qh, qw]`` (dense) ``= x[n, qh-ph+hh, qw-pw+hw, ph, pw]``, 0 outside the mask.

    Blocks ``b = n*h + ph`` in ``[lo, hi)``; in each, ``tile`` planes ``pw`` at a time, row ``qh`` by
    row (one mask row ``dh`` per row), prefetching the next row's sources."""
    hh, hw, hwsz = (hm - 1) // 2, (wm - 1) // 2, h * w
    for b in range(lo, hi):
        n, ph = b // h, b % h
        qa, qb = max(0, ph - hh), min(h, ph - hh + hm)  # rows qh whose dh = qh - ph + hh is inside
        for pw0 in range(0, w, tile):
            pw1 = min(w, pw0 + tile)
            # columns qw whose dw = qw - pw + hw is inside: [max(0, pw-hw), min(w, pw-hw+wm))
            if qa > 0 or qb < h or pw1 - 1 - hw > 0 or pw0 - hw + wm < w:
                _fill_zero(out, (b * w + pw0) * hwsz, (b * w + pw1) * hwsz)
            for qh in range(qa, qb):
                src_row = xo + n * sn + (qh - ph + hh) * sdh + ph * sph
                if qh + 1 < qb:  # pairs (dw, pw), pw in the tile, with qw = dw + pw - hw inside
                    _prefetch_row(x, src_row + sdh, sdw, wm, spw, pw0, pw1, 1, -hw, w, line)
                for pw in range(pw0, pw1):
                    a, e = max(0, pw - hw), min(w, pw - hw + wm)
                    o = (b * w + pw) * hwsz + qh * w
                    s = src_row + pw * spw + (a - pw + hw) * sdw
                    for qw in range(a, e):
                        out[np.uint64(o + qw)] = x[np.uint64(s)]
                        s += sdw


@njit
def _backward_d_major(dx, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, lo, hi, tile, line):
    """``dx[n, dh, dw, ph, pw]`` (dense) ``= dy[n, ph+dh-hh, pw+dw-hw, ph, pw]``, 0 where that is outside
    the feature. Blocks ``b = n*hm + dh`` in ``[lo, hi)``; in each, ``tile`` planes ``dw`` at a time:
    zeroed in one fill, then their valid rows written row ``ph`` by row while still in cache."""
    hh, hw, hwsz = (hm - 1) // 2, (wm - 1) // 2, h * w
    step = spw + sqw
    for b in range(lo, hi):
        n, dh = b // hm, b % hm
        pa, pb = max(0, hh - dh), min(h, h + hh - dh)  # rows ph whose qh = ph + dh - hh is inside
        for dw0 in range(0, wm, tile):
            dw1 = min(wm, dw0 + tile)
            # columns pw whose qw = pw + dw - hw is inside: [max(0, hw-dw), min(w, w+hw-dw))
            if pa > 0 or pb < h or hw - dw0 > 0 or hw - dw1 + 1 < 0:
                _fill_zero(dx, (b * wm + dw0) * hwsz, (b * wm + dw1) * hwsz)
            for ph in range(pa, pb):
                src_row = yo + n * sn + (ph + dh - hh) * sqh + ph * sph
                if ph + 1 < pb:  # pairs (qw, pw) with dw = qw - pw + hw in the tile
                    _prefetch_row(dy, src_row + sqh + sph, sqw, w, spw, 0, w, -1, hw - dw0, dw1 - dw0, line)
                for dw in range(dw0, dw1):
                    a, e = max(0, hw - dw), min(w, w + hw - dw)
                    o = (b * wm + dw) * hwsz + ph * w
                    s = src_row + (dw - hw) * sqw + a * step
                    for pw in range(a, e):
                        dx[np.uint64(o + pw)] = dy[np.uint64(s)]
                        s += step


@njit
def _backward_p_major(dx, dy, yo, sn, sqh, sqw, sph, spw, h, w, hm, wm, lo, hi, tile, line):
    """``dx[n, ph, pw, dh, dw]`` (dense) ``= dy[n, ph+dh-hh, pw+dw-hw, ph, pw]``, 0 where that is outside
    the feature. Blocks ``b = n*h + ph`` in ``[lo, hi)``; in each, ``tile`` planes ``pw`` at a time:
    zeroed in one fill, then their valid rows written row ``dh`` by row while still in cache."""
    hh, hw, msz = (hm - 1) // 2, (wm - 1) // 2, hm * wm
    for b in range(lo, hi):
        n, ph = b // h, b % h
        da, db = max(0, hh - ph), min(hm, h + hh - ph)  # rows dh whose qh = ph + dh - hh is inside
        for pw0 in range(0, w, tile):
            pw1 = min(w, pw0 + tile)
            # columns dw whose qw = pw + dw - hw is inside: [max(0, hw-pw), min(wm, w+hw-pw))
            if da > 0 or db < hm or hw - pw0 > 0 or w + hw - pw1 + 1 < wm:
                _fill_zero(dx, (b * w + pw0) * msz, (b * w + pw1) * msz)
            for dh in range(da, db):
                src_row = yo + n * sn + (ph + dh - hh) * sqh + ph * sph
                if dh + 1 < db:  # pairs (qw, pw), pw in the tile, with dw = qw - pw + hw inside
                    _prefetch_row(dy, src_row + sqh, sqw, w, spw, pw0, pw1, -1, hw, wm, line)
                for pw in range(pw0, pw1):
                    a, e = max(0, hw - pw), min(wm, w + hw - pw)
                    o = (b * w + pw) * msz + dh * wm
                    s = src_row + pw * spw + (pw + a - hw) * sqw
                    for dw in range(a, e):
                        dx[np.uint64(o + dw)] = dy[np.uint64(s)]
                        s += sqw


# ------------------------------------------------------------------------------------------- driver
def _launch(kernel, tile, out: torch.Tensor, src: torch.Tensor, strides, h, w, hm, wm, blocks: int) -> None:
    out_bits, src_bits = storage_bits(out), storage_bits(src)
    args = (out_bits, src_bits, src.storage_offset(), *strides, h, w, hm, wm)
    tail = (max(1, tile), 64 // out.element_size())  # planes per tile, elements per cache line
    compile_scalar(kernel, tuple(numba.typeof(a) for a in args + (0, blocks) + tail))
    workers = torch.get_num_threads()
    if workers < 2 or blocks < 2 or out.numel() < _PARALLEL_ELEMENTS:
        kernel(*args, 0, blocks, *tail)
        return
    # More chunks than threads, taken from the pool's queue as threads come free: on a shared machine one
    # descheduled thread then delays only its current chunk, not half of the work.
    chunks = min(blocks, workers * CHUNKS_PER_THREAD)
    bounds = [blocks * i // chunks for i in range(chunks + 1)]
    futures = [pool(workers).submit(kernel, *args, lo, hi, *tail) for lo, hi in zip(bounds[:-1], bounds[1:])]
    for future in futures:
        future.result()


def forward(x: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str) -> torch.Tensor:
    """x: logical NCHW ``[N, h_mask*w_mask, H, W]`` -> logical NCHW ``[N, H*W, H, W]`` stored in ``layout``."""
    n, _, h, w = x.shape
    out = empty_nchw((n, h * w, h, w), layout, like=x)
    sn, sc, sh, sw = x.stride()
    q_major = (psa_type == COLLECT) == (layout == "NCHW")  # storage [n, q, p] rather than [n, p, q]
    if q_major:
        kernel, tile = _forward_q_major, w
    else:
        kernel, tile = _forward_p_major, CONTIGUOUS_TILE if sc == 1 else w
    _launch(kernel, tile, out, x, (sn, w_mask * sc, sc, sh, sw), h, w, h_mask, w_mask, n * h)
    return out


def backward(dy: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str) -> torch.Tensor:
    """dy: logical NCHW ``[N, H*W, H, W]`` -> dx logical NCHW ``[N, h_mask*w_mask, H, W]``."""
    n, _, h, w = dy.shape
    dx = empty_nchw((n, h_mask * w_mask, h, w), layout, like=dy)
    sn, sc, sh, sw = dy.stride()
    if psa_type == COLLECT:   # channel holds q, spatial holds p
        strides = (sn, w * sc, sc, sh, sw)
    else:                     # channel holds p, spatial holds q
        strides = (sn, sh, sw, w * sc, sc)
    if layout == "NCHW":
        _launch(_backward_d_major, w_mask, dx, dy, strides, h, w, h_mask, w_mask, n * h_mask)
    else:
        tile = CONTIGUOUS_TILE if strides[2] == 1 else w
        _launch(_backward_p_major, tile, dx, dy, strides, h, w, h_mask, w_mask, n * h)
    return dx
