"""psamask in plain torch (the ``torch`` backend): the doc's loop over positions, one window copy each.

Position ``p = (ph, pw)`` sees the neighbours ``q = p + d - half`` (``half = (mask - 1) // 2`` per axis) of
the mask offsets ``d`` that land inside the map: a rectangle. With ``x`` viewed as
``[N, h_mask, w_mask, H, W]`` and ``out`` as ``[N, H, W, H, W]``, COLLECT copies ``out[:, q, p] = x[:, d, p]``
and DISTRIBUTE ``out[:, p, q]``, one slice copy per position; the rest is 0. Backward copies the rectangles
back into zeros.
"""
from __future__ import annotations

import torch

from ..._core.layout import empty_nchw
from .checks import COLLECT


def _windows(h: int, w: int, h_mask: int, w_mask: int, psa_type: int):
    """Yields, per position ``(ph, pw)``, the index of its rectangle in ``x`` ``[N, h_mask, w_mask, H, W]``
    and in ``out`` ``[N, H, W, H, W]``."""
    hh, hw = (h_mask - 1) // 2, (w_mask - 1) // 2
    for ph in range(h):
        top, bottom = max(0, hh - ph), min(h_mask, h + hh - ph)  # mask rows whose neighbour is inside
        for pw in range(w):
            left, right = max(0, hw - pw), min(w_mask, w + hw - pw)
            rows, cols = slice(top + ph - hh, bottom + ph - hh), slice(left + pw - hw, right + pw - hw)
            mask_index = (slice(None), slice(top, bottom), slice(left, right), ph, pw)
            if psa_type == COLLECT:
                yield mask_index, (slice(None), rows, cols, ph, pw)
            else:
                yield mask_index, (slice(None), ph, pw, rows, cols)


def forward(x: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str, out=None) -> torch.Tensor:
    """x: logical NCHW ``[N, h_mask*w_mask, H, W]`` -> logical NCHW ``[N, H*W, H, W]`` stored in ``layout``
    (``out`` when given)."""
    n, _, h, w = x.shape
    out = empty_nchw((n, h * w, h, w), layout, like=x, zero=True) if out is None else out.zero_()
    src, dst = x.unflatten(1, (h_mask, w_mask)), out.unflatten(1, (h, w))
    for mask_index, map_index in _windows(h, w, h_mask, w_mask, psa_type):
        dst[map_index] = src[mask_index]
    return out


def backward(dy: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str, out=None) -> torch.Tensor:
    """dy: logical NCHW ``[N, H*W, H, W]`` -> dx logical NCHW ``[N, h_mask*w_mask, H, W]`` (``out`` when given)."""
    n, _, h, w = dy.shape
    dx = empty_nchw((n, h_mask * w_mask, h, w), layout, like=dy, zero=True) if out is None else out.zero_()
    src, dst = dy.unflatten(1, (h, w)), dx.unflatten(1, (h_mask, w_mask))
    for mask_index, map_index in _windows(h, w, h_mask, w_mask, psa_type):
        dst[mask_index] = src[map_index]
    return dx
