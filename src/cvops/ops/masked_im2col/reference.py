"""Loop reference (the test oracle): the doc's pseudocode, one mask point and one tap at a time.

Only the innermost channel loop is a slice (``[:, ...]``), to keep the unit cases fast.
Rows of ``data_col`` are ordered (c, i, j): ``row = (c*kh + i)*kw + j``.
"""
from __future__ import annotations

import torch


def _taps_inside(mask_h_idx, mask_w_idx, height, width, kernel_h, kernel_w, pad_h, pad_w):
    """The doc's loops over mask points m and taps (i, j): yields ``(m, i, j, h_im, w_im)`` for every tap
    that lands inside the feature (the others read as 0)."""
    for m in range(mask_h_idx.shape[0]):
        h_offset = int(mask_h_idx[m]) - pad_h
        w_offset = int(mask_w_idx[m]) - pad_w
        for i in range(kernel_h):
            h_im = h_offset + i
            for j in range(kernel_w):
                w_im = w_offset + j
                if 0 <= h_im < height and 0 <= w_im < width:
                    yield m, i, j, h_im, w_im


def im2col_forward(feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w):
    """``feature [1, C, H, W]`` -> ``data_col [C*kh*kw, M]``; taps outside the feature are 0."""
    _, channels, height, width = feature.shape
    mask_cnt = mask_h_idx.shape[0]
    data_col = torch.zeros(channels, kernel_h, kernel_w, mask_cnt, dtype=feature.dtype, device=feature.device)
    for m, i, j, h_im, w_im in _taps_inside(mask_h_idx, mask_w_idx, height, width, kernel_h, kernel_w, pad_h, pad_w):
        data_col[:, i, j, m] = feature[0, :, h_im, w_im]
    return data_col.reshape(channels * kernel_h * kernel_w, mask_cnt)


def im2col_backward(grad_col, mask_h_idx, mask_w_idx, channels, height, width, kernel_h, kernel_w, pad_h, pad_w):
    """Adjoint of :func:`im2col_forward`: add every tap's gradient back onto its feature position."""
    mask_cnt = mask_h_idx.shape[0]
    grad_col = grad_col.reshape(channels, kernel_h, kernel_w, mask_cnt)
    acc_dtype = torch.float64 if grad_col.dtype == torch.float64 else torch.float32  # accumulate in fp32 at least
    grad_feature = torch.zeros(1, channels, height, width, dtype=acc_dtype, device=grad_col.device)
    for m, i, j, h_im, w_im in _taps_inside(mask_h_idx, mask_w_idx, height, width, kernel_h, kernel_w, pad_h, pad_w):
        grad_feature[0, :, h_im, w_im] += grad_col[:, i, j, m].to(acc_dtype)
    return grad_feature.to(grad_col.dtype)


def col2im_forward(masked_output, mask_h_idx, mask_w_idx, height, width):
    """``masked_output [C, M]`` -> ``output [1, C, H, W]``: zeros, then column m written at
    ``(mask_h_idx[m], mask_w_idx[m])``. Points outside ``H x W`` are dropped; where two points
    share a position the later one (larger m) wins."""
    channels, mask_cnt = masked_output.shape
    output = torch.zeros(1, channels, height, width, dtype=masked_output.dtype, device=masked_output.device)
    for m in range(mask_cnt):
        h, w = int(mask_h_idx[m]), int(mask_w_idx[m])
        if 0 <= h < height and 0 <= w < width:
            output[0, :, h, w] = masked_output[:, m]
    return output


def col2im_backward(grad_output, mask_h_idx, mask_w_idx):
    """Adjoint of :func:`col2im_forward`: column m reads the gradient at its position if it is the
    point that was written there (in range, last of its duplicates), else 0."""
    _, channels, height, width = grad_output.shape
    mask_cnt = mask_h_idx.shape[0]
    grad_masked = torch.zeros(channels, mask_cnt, dtype=grad_output.dtype, device=grad_output.device)
    taken = set()
    for m in reversed(range(mask_cnt)):
        h, w = int(mask_h_idx[m]), int(mask_w_idx[m])
        if 0 <= h < height and 0 <= w < width and (h, w) not in taken:
            taken.add((h, w))
            grad_masked[:, m] = grad_output[0, :, h, w]
    return grad_masked
