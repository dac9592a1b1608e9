"""psamask on the CPU: the whole operator is one affine gather, done as strided copies.

With ``dh = qh - ph + hh`` and ``dw = qw - pw + hw`` (q: neighbour, p: position),
COLLECT writes ``out[n, q, p] = x[n, dh*w_mask + dw, p]`` and DISTRIBUTE ``out[n, p, q]`` (its transpose).
Per spatial axis there are two shapes of the index set:
- *window*: the mask covers every offset the feature can produce (``hh >= H-1`` and
  ``h_mask-1-hh >= H-1``, true at PSANet scale); then (q, p) range over the full square and the source is
  an affine view of x with strides ``(s_dh, s_ph - s_dh)``, negative for NCHW. One copy does the axis.
- *diagonal*: otherwise, one copy per mask row ``dh``: p runs over the rows where q stays inside the
  feature, and q = p + dh - hh moves with it.
Backward is the same views with source and destination swapped, into a zero-filled ``dx``.

With numba installed (and ``CVOPS_NUMBA`` not ``0``) ``cpu_numba`` does the same job as compiled loops,
faster at PSANet scale; this module is the fallback.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import torch

from ..._core.jit import numba_kernels
from ..._core.layout import empty_nchw
from ..._core.parallel import run_split
from ..._core.strided import View, strided_copy, zero_fill
from .checks import COLLECT


class _Piece(NamedTuple):
    """One axis of one strided copy: sizes, strides in the mask- and position-indexed tensors, offsets.

    ``p_dim`` is the index (within ``sizes``) of the position dimension, whose first value is ``p_lo``.
    """

    sizes: tuple
    mask_strides: tuple
    pos_strides: tuple
    mask_offset: int
    pos_offset: int
    p_dim: int
    p_lo: int

    def restrict(self, lo: int, hi: int):
        """The same piece with the position limited to ``[lo, hi)``, or None if nothing is left."""
        start, stop = max(lo, self.p_lo), min(hi, self.p_lo + self.sizes[self.p_dim])
        if start >= stop:
            return None
        sizes = list(self.sizes)
        sizes[self.p_dim] = stop - start
        skip = start - self.p_lo
        return self._replace(sizes=tuple(sizes), p_lo=start,
                             mask_offset=self.mask_offset + skip * self.mask_strides[self.p_dim],
                             pos_offset=self.pos_offset + skip * self.pos_strides[self.p_dim])


def _axis_pieces(size, mask, half, s_m, s_p, s_q, s_pp, offsets=None):
    """The pieces of one spatial axis (diagonal pieces of the mask ``offsets`` only, when given).

    s_m/s_p: strides of the mask offset d and the position p in the mask-indexed tensor;
    s_q/s_pp: strides of q and p in the position-indexed tensor.
    """
    if offsets is None and half >= size - 1 and mask - 1 - half >= size - 1:  # window: one piece over (q, p)
        return [_Piece((size, size), (s_m, s_p - s_m), (s_q, s_pp), half * s_m, 0, 1, 0)]
    pieces = []
    for d in range(mask) if offsets is None else offsets:  # diagonal: one piece per mask offset, p where q = p + d - half is inside
        lo, hi = max(0, half - d), min(size, size + half - d)
        if lo < hi:
            pieces.append(_Piece((hi - lo,), (s_p,), (s_q + s_pp,), d * s_m + lo * s_p,
                                 (lo + d - half) * s_q + lo * s_pp, 0, lo))
    return pieces


def _views(mask_t, pos_t, psa_type, h_mask, w_mask, rows=None, mask_rows=None):
    """Yield matching (mask-tensor View, position-tensor View) pairs covering every valid (n, q, p).

    ``rows``: only positions with ``ph`` in this range; ``mask_rows``: only these mask offsets ``dh``.
    """
    n, _, h, w = mask_t.shape
    mn, mc, mh, mw = mask_t.stride()
    pn, pc, ph, pw = pos_t.stride()
    if psa_type == COLLECT:   # channel holds q, spatial holds p
        pos_q, pos_p = (w * pc, pc), (ph, pw)
    else:                     # channel holds p, spatial holds q
        pos_q, pos_p = (ph, pw), (w * pc, pc)
    h_pieces = _axis_pieces(h, h_mask, (h_mask - 1) // 2, w_mask * mc, mh, pos_q[0], pos_p[0], mask_rows)
    if rows is not None:
        h_pieces = [r for r in (piece.restrict(*rows) for piece in h_pieces) if r is not None]
    w_pieces = _axis_pieces(w, w_mask, (w_mask - 1) // 2, mc, mw, pos_q[1], pos_p[1])
    for hp, wp in itertools.product(h_pieces, w_pieces):
        sizes = (n,) + hp.sizes + wp.sizes
        yield (View(sizes, (mn,) + hp.mask_strides + wp.mask_strides, hp.mask_offset + wp.mask_offset),
               View(sizes, (pn,) + hp.pos_strides + wp.pos_strides, hp.pos_offset + wp.pos_offset))


def _covers(t_size_h, t_size_w, h_mask, w_mask) -> bool:
    hh, hw = (h_mask - 1) // 2, (w_mask - 1) // 2
    return (hh >= t_size_h - 1 and h_mask - 1 - hh >= t_size_h - 1
            and hw >= t_size_w - 1 and w_mask - 1 - hw >= t_size_w - 1)


def forward(x: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str) -> torch.Tensor:
    """x: logical NCHW ``[N, h_mask*w_mask, H, W]`` -> logical NCHW ``[N, H*W, H, W]`` stored in ``layout``."""
    fast = numba_kernels(__package__, x)
    if fast is not None:
        return fast.forward(x, psa_type, h_mask, w_mask, layout)
    n, _, h, w = x.shape
    # Uncovered positions must read as zero; when the window covers everything none are left.
    out = empty_nchw((n, h * w, h, w), layout, like=x, zero=not _covers(h, w, h_mask, w_mask))
    for src, dst in _views(x, out, psa_type, h_mask, w_mask):
        strided_copy(out, dst, x, src)
    return out


def backward(dy: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str) -> torch.Tensor:
    """dy: logical NCHW ``[N, H*W, H, W]`` -> dx logical NCHW ``[N, h_mask*w_mask, H, W]``."""
    fast = numba_kernels(__package__, dy)
    if fast is not None:
        return fast.backward(dy, psa_type, h_mask, w_mask, layout)
    n, _, h, w = dy.shape
    dx = empty_nchw((n, h_mask * w_mask, h, w), layout, like=dy)
    # dx is mostly zeros (3/4 at PSANet scale). Zeroing all of it first and then scattering the values
    # would stream it through memory twice; one contiguous block at a time, the values land while the
    # freshly zeroed block is still in cache. Blocks: a mask row dh (channel-major dx, NCHW) or a
    # position row ph (channels-last dx, NHWC).
    if dx.stride(1) > dx.stride(2):
        blocks = ((dx[:, dh * w_mask:(dh + 1) * w_mask], {"mask_rows": (dh,)}) for dh in range(h_mask))
    else:
        blocks = ((dx[:, :, row, :], {"rows": (row, row + 1)}) for row in range(h))

    def fill_block(block_part):
        block, part = block_part
        zero_fill(block)
        for dst, src in _views(dx, dy, psa_type, h_mask, w_mask, **part):
            strided_copy(dx, dst, dy, src, parallel=False)

    run_split(list(blocks), fill_block)
    return dx
