"""CARAFE on CPU in plain torch (the ``torch`` backend): the formula one kernel tap at a time.

With ``r = (k - 1) // 2``, output block ``(y, x)`` (its ``s x s`` sub-pixels) reads through tap
``(ky, kx)`` the input pixel ``(y + ky - r, x + kx - r)``, zero outside the map. The forward adds, per
tap, the shifted features times that tap's mask; the backward reads the same products the other way,
grad_input gathering from the blocks ``(y - ky + r, x - kx + r)`` that read a pixel (no scatter). Sums
run in a fixed order (taps, then sub-pixels), so the bits do not depend on the thread count. Taps
outside the map have their mask zeroed (an inf there must not meet the padding) and grad_mask 0.

Work goes in chunks of rows of one image, channels-last in float32 (float64 for float64), so that a
call holds about ``_CHUNK`` elements besides its outputs, whatever the batch and the height.
"""
from __future__ import annotations

import torch

from ..._core.layout import empty_nchw

_CHUNK = 1 << 20  # elements a chunk holds: 4 MiB of float32


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunks(n: int, h: int, w: int, c: int, k: int, g: int, s: int) -> list[tuple[int, int, int]]:
    """``(image, y0, y1)``: row ranges of the map whose buffers hold about ``_CHUNK`` elements (at least one row)."""
    r = (k - 1) // 2
    per_row = (w + 2 * r) * ((3 * s * s + 1) * c + 2 * s * s * g * k * k)  # the backward's buffers per block row
    step = max(1, _CHUNK // per_row)
    return [(i, y, min(y + step, h)) for i in range(n) for y in range(0, h, step)]


def _frame(t: torch.Tensor, i: int, y0: int, y1: int, s: int, pad: int, acc) -> torch.Tensor:
    """Block rows ``[y0, y1)`` and columns ``[-pad, W + pad)`` of image ``i`` of the logical NCHW ``t``
    (``s x s`` pixels a block), zero outside the map: channels-last ``[y1 - y0, s, W + 2*pad, s, C]``."""
    h, w = t.shape[2] // s, t.shape[3] // s
    a, b = min(max(y0, 0), h), max(min(y1, h), 0)
    out = torch.zeros(((y1 - y0) * s, (w + 2 * pad) * s, t.shape[1]), dtype=acc)
    if a < b:
        out[(a - y0) * s:(b - y0) * s, pad * s:(pad + w) * s] = t[i, :, a * s:b * s].permute(1, 2, 0)
    return out.view(y1 - y0, s, w + 2 * pad, s, t.shape[1])


def _store(out: torch.Tensor, i: int, y0: int, y1: int, s: int, src: torch.Tensor) -> None:
    """Rows ``[y0*s, y1*s)`` of image ``i`` of the logical NCHW ``out`` <- channels-last ``src``."""
    dst = out[i, :, y0 * s:y1 * s].permute(1, 2, 0)
    dst.copy_(src.reshape(dst.shape))


def _taps(k: int, h: int, w: int) -> list[tuple[int, int]]:
    """The taps ``(ky, kx)`` that reach the map from some block."""
    r = (k - 1) // 2
    return [(ky, kx) for ky in range(k) for kx in range(k) if abs(ky - r) < h and abs(kx - r) < w]


def _zero_outside_taps(t: torch.Tensor, h: int, w: int, y0: int, r: int) -> None:
    """Zero, in ``t`` (``[R, s, W, s, G, k, k]``, taps of the blocks of rows ``[y0, y0 + R)``), the taps that
    land outside the map."""
    k, taps = t.shape[-1], torch.arange(t.shape[-1]) - r
    ys, xs = torch.arange(y0, y0 + t.shape[0])[:, None] + taps, torch.arange(w)[:, None] + taps
    rows_out, cols_out = (ys < 0) | (ys >= h), (xs < 0) | (xs >= w)
    t.masked_fill_(rows_out.view(-1, 1, 1, 1, 1, k, 1) | cols_out.view(1, 1, w, 1, 1, 1, k), 0)


def _forward_rows(out, features, masks, k, g, s, chunk) -> None:
    """Output rows ``[y0*s, y1*s)`` of image ``i``, for ``chunk = (i, y0, y1)``."""
    (_, c, h, w), (i, y0, y1) = features.shape, chunk
    rows, r, acc = y1 - y0, (k - 1) // 2, acc_dtype(features.dtype)
    x = _frame(features, i, y0 - r, y1 + r, 1, r, acc).view(rows + 2 * r, 1, w + 2 * r, 1, g, c // g)
    m = _frame(masks, i, y0, y1, s, 0, acc).view(rows, s, w, s, g, k, k)
    _zero_outside_taps(m, h, w, y0, r)
    y = torch.zeros((rows, s, w, s, g, c // g), dtype=acc)
    for ky, kx in _taps(k, h, w):
        y.addcmul_(x[ky:ky + rows, :, kx:kx + w], m[..., ky, kx, None])
    _store(out, i, y0, y1, s, y)


def _backward_rows(grad_input, grad_mask, grad_output, features, masks, k, g, s, chunk) -> None:
    """grad_input rows ``[y0, y1)`` and grad_mask rows ``[y0*s, y1*s)`` of image ``i``, for ``chunk = (i, y0, y1)``."""
    (_, c, h, w), (i, y0, y1) = features.shape, chunk
    rows, r, acc = y1 - y0, (k - 1) // 2, acc_dtype(features.dtype)
    x = _frame(features, i, y0 - r, y1 + r, 1, r, acc).view(rows + 2 * r, 1, w + 2 * r, 1, g, c // g)
    gy = _frame(grad_output, i, y0, y1, s, 0, acc).view(rows, s, w, s, g, c // g)
    gm = torch.zeros((rows, s, w, s, g, k, k), dtype=acc)
    gx = torch.zeros((rows, w, g, c // g), dtype=acc)
    for ky in range(k):
        if abs(ky - r) >= h:
            continue
        # pixel (y, x) is read through tap (ky, kx) by block (y - ky + r, x - kx + r): these block rows,
        # with r zero columns each side, hold every block that reads the chunk's pixels through row ky
        readers = (y0 - ky + r, y1 - ky + r, s, r, acc)
        gy_k = _frame(grad_output, i, *readers).view(rows, s, w + 2 * r, s, g, c // g)
        m_k = _frame(masks, i, *readers).view(rows, s, w + 2 * r, s, g, k, k)[..., ky, :]
        for kx in range(k):
            if abs(kx - r) >= w:
                continue
            gm[..., ky, kx] = (x[ky:ky + rows, :, kx:kx + w] * gy).sum(-1)
            cols = slice(2 * r - kx, 2 * r - kx + w)
            for a in range(s):
                for b in range(s):
                    gx.addcmul_(m_k[:, a, cols, b, :, kx, None], gy_k[:, a, cols, b])
    _zero_outside_taps(gm, h, w, y0, r)
    _store(grad_mask, i, y0, y1, s, gm)
    _store(grad_input, i, y0, y1, 1, gx)


def forward(features: torch.Tensor, masks: torch.Tensor, kernel_size: int, group_size: int,
            scale_factor: int, layout: str = "NCHW") -> torch.Tensor:
    """features ``[N, C, H, W]`` and masks ``[N, G*k*k, sH, sW]`` (logical NCHW views) ->
    output ``[N, C, sH, sW]`` (logical NCHW view, stored in ``layout``)."""
    n, c, h, w = features.shape
    k, g, s = kernel_size, group_size, scale_factor
    out = empty_nchw((n, c, h * s, w * s), layout, like=features)
    for chunk in _chunks(n, h, w, c, k, g, s):
        _forward_rows(out, features, masks, k, g, s, chunk)
    return out


def backward(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor, kernel_size: int,
             group_size: int, scale_factor: int, layout: str = "NCHW"):
    """Returns ``(grad_input [N, C, H, W], grad_mask [N, G*k*k, sH, sW])`` as logical NCHW views
    stored in ``layout``."""
    n, c, h, w = features.shape
    k, g, s = kernel_size, group_size, scale_factor
    grad_input = empty_nchw((n, c, h, w), layout, like=features)
    grad_mask = empty_nchw(tuple(masks.shape), layout, like=masks)
    for chunk in _chunks(n, h, w, c, k, g, s):
        _backward_rows(grad_input, grad_mask, grad_output, features, masks, k, g, s, chunk)
    return grad_input, grad_mask
