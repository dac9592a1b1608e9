"""The ``torch`` backend of masked_im2col (device-agnostic torch code).

im2col is one ``index_select`` along the plane axis: one index row of length ``kh*kw*M`` (tap-major,
m-minor) serves every channel and writes ``data_col`` in its final (c, i, j) x m order. Taps outside the
feature read position 0 and are zeroed afterwards, which keeps NaN/Inf bits exact. ``cpu_numba`` runs
the forward and its adjoint as loops instead, with the same bits.
"""
from __future__ import annotations

import torch

from ..._core.memory import new_empty, new_zeros


def tap_positions(mask_h_idx, mask_w_idx, height, width, kernel_h, kernel_w, pad_h, pad_w):
    """Flat source position of every (tap, mask point), shape ``[kh*kw*M]``, and its validity."""
    idx_h = mask_h_idx.to(torch.int64)
    idx_w = mask_w_idx.to(torch.int64)
    taps_i = torch.arange(kernel_h, device=idx_h.device).view(kernel_h, 1, 1)
    taps_j = torch.arange(kernel_w, device=idx_h.device).view(1, kernel_w, 1)
    h_im = idx_h.view(1, 1, -1) - pad_h + taps_i
    w_im = idx_w.view(1, 1, -1) - pad_w + taps_j
    valid = (h_im >= 0) & (h_im < height) & (w_im >= 0) & (w_im < width)
    flat = torch.where(valid, h_im * width + w_im, 0)
    return flat.reshape(-1), valid.reshape(-1)


def im2col_forward(feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w):
    """``feature [1, C, H, W]`` -> ``data_col [C*kh*kw, M]`` (see the module docstring)."""
    _, channels, height, width = feature.shape
    mask_cnt = mask_h_idx.shape[0]
    taps = kernel_h * kernel_w
    data_col = new_empty((channels, taps * mask_cnt), feature.dtype, feature.device)
    if mask_cnt == 0:
        return data_col.view(channels * taps, 0)
    flat, valid = tap_positions(mask_h_idx, mask_w_idx, height, width, kernel_h, kernel_w, pad_h, pad_w)
    # index_select along dim 1 copies bits (NaN payloads kept; torch.gather rewrites fp16/bf16
    # NaNs) and walks one channel plane at a time, which stays in cache.
    planes = feature.reshape(channels, height * width)
    torch.index_select(planes, 1, flat, out=data_col)
    outside = (~valid).nonzero().squeeze(1)
    if outside.numel():
        data_col.index_fill_(1, outside, 0)
    return data_col.view(channels * taps, mask_cnt)


def im2col_backward(grad_col, mask_h_idx, mask_w_idx, channels, height, width, kernel_h, kernel_w, pad_h, pad_w):
    """Adjoint of im2col: ``grad_col [C*kh*kw, M]`` -> ``grad_feature [1, C, H, W]``.

    One ``index_add_`` into a buffer padded by (k-1) on every side, so every tap of a window that touches
    the feature lands inside it (windows that miss the feature entirely are dropped). It adds the columns
    in index order, tap-major: each position sums its taps in order and, within a tap, mask points that
    share a window origin in the order of m, on any thread count.
    """
    mask_cnt = mask_h_idx.shape[0]
    taps = kernel_h * kernel_w
    top = mask_h_idx.to(torch.int64) - pad_h
    left = mask_w_idx.to(torch.int64) - pad_w
    touches = (top > -kernel_h) & (top < height) & (left > -kernel_w) & (left < width)
    buf_h, buf_w = height + 2 * (kernel_h - 1), width + 2 * (kernel_w - 1)
    # fp16/bf16 gradients are summed in fp32 and rounded once at the end
    acc_dtype = torch.float64 if grad_col.dtype == torch.float64 else torch.float32
    buffer = new_zeros((channels, buf_h * buf_w), acc_dtype, grad_col.device)
    grad_col = grad_col.reshape(channels * taps, mask_cnt)
    if not bool(touches.all()):
        points = touches.nonzero().squeeze(1)
        top, left, grad_col = top[points], left[points], grad_col.index_select(1, points)
    origin = (top + kernel_h - 1) * buf_w + (left + kernel_w - 1)
    shift = (torch.arange(kernel_h, device=origin.device).view(-1, 1) * buf_w
             + torch.arange(kernel_w, device=origin.device)).view(-1, 1)
    buffer.index_add_(1, (shift + origin).view(-1), grad_col.reshape(channels, taps * top.shape[0]).to(acc_dtype))
    inner = (slice(None), slice(kernel_h - 1, kernel_h - 1 + height), slice(kernel_w - 1, kernel_w - 1 + width))
    buffer = buffer.view(channels, buf_h, buf_w)[inner]
    return buffer.unsqueeze(0).to(grad_col.dtype).contiguous()


def scatter_targets(mask_h_idx, mask_w_idx, height, width):
    """Flat target ``h*W + w`` of each mask point and whether it is written: inside ``H x W`` and the
    last point (largest m) at its position."""
    idx_h = mask_h_idx.to(torch.int64)
    idx_w = mask_w_idx.to(torch.int64)
    inside = (idx_h >= 0) & (idx_h < height) & (idx_w >= 0) & (idx_w < width)
    flat = torch.where(inside, idx_h * width + idx_w, 0)
    if height * width == 0:
        return flat, inside
    order = torch.arange(flat.numel(), device=flat.device)
    last = torch.full((height * width,), -1, dtype=torch.int64, device=flat.device)
    last.scatter_reduce_(0, flat[inside], order[inside], reduce="amax")
    return flat, inside & (last[flat] == order)


def col2im_forward(masked_output, mask_h_idx, mask_w_idx, height, width):
    """``masked_output [C, M]`` -> ``output [1, C, H, W]``, zeros except at the written points."""
    channels = masked_output.shape[0]
    output = new_zeros((channels, height * width), masked_output.dtype, masked_output.device)
    flat, written = scatter_targets(mask_h_idx, mask_w_idx, height, width)
    if bool(written.all()):
        output.index_copy_(1, flat, masked_output)
    else:
        cols = written.nonzero().squeeze(1)
        output.index_copy_(1, flat[cols], masked_output.index_select(1, cols))
    return output.view(1, channels, height, width)


def col2im_backward(grad_output, mask_h_idx, mask_w_idx):
    """Adjoint of col2im: ``grad_output [1, C, H, W]`` -> ``[C, M]`` (0 for points not written)."""
    _, channels, height, width = grad_output.shape
    mask_cnt = mask_h_idx.shape[0]
    flat, written = scatter_targets(mask_h_idx, mask_w_idx, height, width)
    if height * width == 0:
        return torch.zeros(channels, mask_cnt, dtype=grad_output.dtype, device=grad_output.device)
    grad = grad_output.reshape(channels, height * width).index_select(1, flat)
    skipped = (~written).nonzero().squeeze(1)
    if skipped.numel():
        grad.index_fill_(1, skipped, 0)
    return grad
