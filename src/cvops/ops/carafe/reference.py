"""Literal loops of the carafe formula (semantics.md §4; design doc 3.2 with its typos fixed:
the bound is ``ix > W - 1``/``iy > H - 1``, and the tap index is relative to the window).

The oracle of the tests, never the fast path. Only the channel loop of a group is a slice.
Accumulation is in float64; results are cast to the input dtype. Inputs are logical NCHW views.
"""
from __future__ import annotations

import torch

from ..._core.layout import as_nchw, from_nchw


def _taps(n_count, c, h, w, k, g_count, s):
    """The doc's loops: for each output pixel (oy, ox), group g and window tap (ky, kx) that lands inside
    the feature (implicit zero padding elsewhere), yields ``(n, oy, ox, channels of g, mask channel, iy, ix)``."""
    cg, r = c // g_count, (k - 1) // 2
    for n in range(n_count):
        for oy in range(h * s):
            for ox in range(w * s):
                iy0, ix0 = oy // s, ox // s
                for g in range(g_count):
                    ch = slice(g * cg, (g + 1) * cg)
                    for ky in range(k):
                        for kx in range(k):
                            iy, ix = iy0 + ky - r, ix0 + kx - r
                            if iy < 0 or iy > h - 1 or ix < 0 or ix > w - 1:
                                continue
                            yield n, oy, ox, ch, (g * k + ky) * k + kx, iy, ix


def forward(features: torch.Tensor, masks: torch.Tensor, kernel_size: int, group_size: int,
            scale_factor: int, layout: str = "NCHW") -> torch.Tensor:
    k, g_count, s = kernel_size, group_size, scale_factor
    n_count, c, h, w = features.shape
    x = features.double()
    m = masks.double()
    out = torch.zeros(n_count, c, h * s, w * s, dtype=torch.float64, device=features.device)
    for n, oy, ox, ch, mc, iy, ix in _taps(n_count, c, h, w, k, g_count, s):
        out[n, ch, oy, ox] += m[n, mc, oy, ox] * x[n, ch, iy, ix]
    return _in_layout(out.to(features.dtype), layout)


def backward(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor, kernel_size: int,
             group_size: int, scale_factor: int, layout: str = "NCHW"):
    """Returns ``(grad_input, grad_mask)`` following the doc's accumulation loop."""
    k, g_count, s = kernel_size, group_size, scale_factor
    n_count, c, h, w = features.shape
    x, m, gy = features.double(), masks.double(), grad_output.double()
    grad_x = torch.zeros_like(x)
    grad_m = torch.zeros_like(m)
    for n, oy, ox, ch, mc, iy, ix in _taps(n_count, c, h, w, k, g_count, s):
        grad_x[n, ch, iy, ix] += m[n, mc, oy, ox] * gy[n, ch, oy, ox]
        grad_m[n, mc, oy, ox] += (x[n, ch, iy, ix] * gy[n, ch, oy, ox]).sum()
    return (_in_layout(grad_x.to(features.dtype), layout), _in_layout(grad_m.to(masks.dtype), layout))


def _in_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A logical NCHW tensor stored in ``layout`` (returned as its NCHW view)."""
    return as_nchw(from_nchw(t, layout).contiguous(), layout)
