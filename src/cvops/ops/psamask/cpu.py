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
"""
from __future__ import annotations

import itertools

import torch

from ..._core.layout import empty_nchw
from ..._core.strided import View, strided_copy
from .checks import COLLECT


def _axis_pieces(size, mask, half, s_m, s_p, s_q, s_pp, window_ok=True):
    """Iteration pieces of one spatial axis as (sizes, mask strides, pos strides, mask off, pos off).

    s_m/s_p: strides of the mask offset d and the position p in the mask-indexed tensor;
    s_q/s_pp: strides of q and p in the position-indexed tensor.
    """
    if window_ok and half >= size - 1 and mask - 1 - half >= size - 1:  # window: one piece over (q, p)
        return [((size, size), (s_m, s_p - s_m), (s_q, s_pp), half * s_m, 0)]
    pieces = []
    for d in range(mask):  # diagonal: one piece per mask offset, p where q = p + d - half is inside
        lo, hi = max(0, half - d), min(size, size + half - d)
        if lo < hi:
            pieces.append(((hi - lo,), (s_p,), (s_q + s_pp,), d * s_m + lo * s_p, (lo + d - half) * s_q + lo * s_pp))
    return pieces


def _views(mask_t, pos_t, psa_type, h_mask, w_mask, write_mask=False):
    """Yield matching (mask-tensor View, position-tensor View) pairs covering every valid (n, q, p).

    ``write_mask``: the mask-indexed tensor is the destination (backward). When its innermost axis is
    w (NCHW), the window form would store with stride ``1 - H*W``; the diagonal form stores rows
    contiguously, which is worth its ``w_mask`` extra copies.
    """
    n, _, h, w = mask_t.shape
    mn, mc, mh, mw = mask_t.stride()
    pn, pc, ph, pw = pos_t.stride()
    if psa_type == COLLECT:   # channel holds q, spatial holds p
        pos_q, pos_p = (w * pc, pc), (ph, pw)
    else:                     # channel holds p, spatial holds q
        pos_q, pos_p = (ph, pw), (w * pc, pc)
    h_pieces = _axis_pieces(h, h_mask, (h_mask - 1) // 2, w_mask * mc, mh, pos_q[0], pos_p[0])
    w_window_ok = not (write_mask and abs(mw) < abs(mc))
    w_pieces = _axis_pieces(w, w_mask, (w_mask - 1) // 2, mc, mw, pos_q[1], pos_p[1], w_window_ok)
    for (hs, hm_s, hp_s, hm_o, hp_o), (ws, wm_s, wp_s, wm_o, wp_o) in itertools.product(h_pieces, w_pieces):
        yield (View((n,) + hs + ws, (mn,) + hm_s + wm_s, hm_o + wm_o),
               View((n,) + hs + ws, (pn,) + hp_s + wp_s, hp_o + wp_o))


def _covers(t_size_h, t_size_w, h_mask, w_mask) -> bool:
    hh, hw = (h_mask - 1) // 2, (w_mask - 1) // 2
    return (hh >= t_size_h - 1 and h_mask - 1 - hh >= t_size_h - 1
            and hw >= t_size_w - 1 and w_mask - 1 - hw >= t_size_w - 1)


def forward(x: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str) -> torch.Tensor:
    """x: logical NCHW ``[N, h_mask*w_mask, H, W]`` -> logical NCHW ``[N, H*W, H, W]`` stored in ``layout``."""
    n, _, h, w = x.shape
    # Uncovered positions must read as zero; when the window covers everything none are left.
    out = empty_nchw((n, h * w, h, w), layout, like=x, zero=not _covers(h, w, h_mask, w_mask))
    for src, dst in _views(x, out, psa_type, h_mask, w_mask):
        strided_copy(out, dst, x, src)
    return out


def backward(dy: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str) -> torch.Tensor:
    """dy: logical NCHW ``[N, H*W, H, W]`` -> dx logical NCHW ``[N, h_mask*w_mask, H, W]``."""
    n, _, h, w = dy.shape
    dx = empty_nchw((n, h_mask * w_mask, h, w), layout, like=dy, zero=True)
    for dst, src in _views(dx, dy, psa_type, h_mask, w_mask, write_mask=True):
        strided_copy(dx, dst, dy, src)
    return dx
