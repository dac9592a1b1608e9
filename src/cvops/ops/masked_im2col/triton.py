"""Triton kernels (CUDA tensors; tested on CPU under ``TRITON_INTERPRET=1``).

* im2col: one program per (block of mask points, tap, block of channels); stores run along M, the
  contiguous axis of ``data_col``, so they coalesce.
* col2im: a zero output, then a scatter of the written points (unique targets: no atomics; the others
  carry target -1, so nothing is read back to the host). Its adjoint is im2col with a 1x1 window.
* im2col backward: one launch per (tap, duplicate round), so every destination of a launch is distinct:
  a race-free load-add-store in a fixed order. The round count is read back (one sync per call).

Offsets are int32 where every span fits (``_core.indexing``), else int64 (``INDEX_64``). Mask indices may
hold any value: the window test runs in their own dtype. Tiles of 16 channels x 64 points keep every
kernel under 64 registers.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._core.indexing import needs_int64
from . import cpu

BLOCK_M = 64
BLOCK_C = 16
NUM_WARPS = 4


@triton.jit
def _im2col_kernel(feat_ptr, h_ptr, w_ptr, out_ptr, C, H, W, M, stride_c, stride_h, stride_w,
                   kernel_w, taps, pad_h, pad_w, INDEX_64: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_C: tl.constexpr):
    pid_m = tl.program_id(0)
    tap = tl.program_id(1)
    pid_c = tl.program_id(2)
    if INDEX_64:
        pid_m = pid_m.to(tl.int64)
        pid_c = pid_c.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = offs_m < M
    # the window test in the indices' own dtype (any value is legal), offsets only where it passes
    h_im = tl.load(h_ptr + offs_m, mask=in_m, other=0) - pad_h + tap // kernel_w
    w_im = tl.load(w_ptr + offs_m, mask=in_m, other=0) - pad_w + tap % kernel_w
    inside = in_m & (h_im >= 0) & (h_im < H) & (w_im >= 0) & (w_im < W)
    h_im = tl.where(inside, h_im, 0).to(offs_m.dtype)
    w_im = tl.where(inside, w_im, 0).to(offs_m.dtype)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    src = feat_ptr + offs_c[:, None] * stride_c + (h_im * stride_h + w_im * stride_w)[None, :]
    vals = tl.load(src, mask=in_c[:, None] & inside[None, :], other=0)
    rows = offs_c * taps + tap
    tl.store(out_ptr + rows[:, None] * M + offs_m[None, :], vals, mask=in_c[:, None] & in_m[None, :])


@triton.jit
def _scatter_columns_kernel(src_ptr, cols_ptr, dst_ptr, C, P, M, HW, ACCUMULATE: tl.constexpr,
                            INDEX_64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """``dst[c, target[p]] (+)= src[c, col[p]]`` for P points with distinct targets (-1: skip the point).

    ``cols_ptr`` holds P source columns followed by P flat targets.
    """
    pid_p = tl.program_id(0)
    pid_c = tl.program_id(1)
    if INDEX_64:
        pid_p = pid_p.to(tl.int64)
        pid_c = pid_c.to(tl.int64)
    offs_p = pid_p * BLOCK_M + tl.arange(0, BLOCK_M)
    in_p = offs_p < P
    col = tl.load(cols_ptr + offs_p, mask=in_p, other=0)
    target = tl.load(cols_ptr + P + offs_p, mask=in_p, other=-1)
    in_p = target >= 0
    target = tl.where(in_p, target, 0)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (offs_c < C)[:, None] & in_p[None, :]
    vals = tl.load(src_ptr + offs_c[:, None] * M + col[None, :], mask=ok, other=0)
    dst = dst_ptr + offs_c[:, None] * HW + target[None, :]
    if ACCUMULATE:
        old = tl.load(dst, mask=ok, other=0)  # the destination is fp32 or fp64
        vals = old + vals.to(old.dtype)
    tl.store(dst, vals, mask=ok)


def im2col_forward(feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w):
    _, channels, height, width = feature.shape
    mask_cnt = mask_h_idx.shape[0]
    taps = kernel_h * kernel_w
    data_col = torch.empty(channels * taps, mask_cnt, dtype=feature.dtype, device=feature.device)
    if mask_cnt == 0:
        return data_col
    grid = (triton.cdiv(mask_cnt, BLOCK_M), taps, triton.cdiv(channels, BLOCK_C))
    _im2col_kernel[grid](feature, mask_h_idx.contiguous(), mask_w_idx.contiguous(), data_col,
                         channels, height, width, mask_cnt, feature.stride(1), feature.stride(2),
                         feature.stride(3), kernel_w, taps, pad_h, pad_w,
                         INDEX_64=needs_int64(feature, data_col, mask_cnt + BLOCK_M, channels + BLOCK_C),
                         BLOCK_M=BLOCK_M, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
    return data_col


def _scatter_columns(src, cols, targets, dst, accumulate):
    points = cols.numel()
    if points == 0:
        return
    channels, mask_cnt = src.shape
    index_64 = needs_int64(src, dst, 2 * points + BLOCK_M, channels + BLOCK_C)
    index = torch.cat([cols, targets]).to(torch.int64 if index_64 else torch.int32).contiguous()
    grid = (triton.cdiv(points, BLOCK_M), triton.cdiv(channels, BLOCK_C))
    _scatter_columns_kernel[grid](src, index, dst, channels, points, mask_cnt, dst.shape[1],
                                  ACCUMULATE=accumulate, INDEX_64=index_64, BLOCK_M=BLOCK_M, BLOCK_C=BLOCK_C,
                                  num_warps=NUM_WARPS)


def _duplicate_rank(keys):
    """For each entry, how many earlier entries (in index order) share its key."""
    sorted_keys, order = torch.sort(keys, stable=True)
    n = keys.numel()
    pos = torch.arange(n, device=keys.device)
    new_group = torch.ones(n, dtype=torch.bool, device=keys.device)
    new_group[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group_start = torch.cummax(torch.where(new_group, pos, 0), 0).values
    rank = torch.empty_like(pos)
    rank[order] = pos - group_start
    return rank


def im2col_backward(grad_col, mask_h_idx, mask_w_idx, channels, height, width, kernel_h, kernel_w, pad_h, pad_w):
    mask_cnt = mask_h_idx.shape[0]
    taps = kernel_h * kernel_w
    grad_col = grad_col.reshape(channels, taps * mask_cnt).contiguous()
    top = mask_h_idx.to(torch.int64) - pad_h
    left = mask_w_idx.to(torch.int64) - pad_w
    touches = (top > -kernel_h) & (top < height) & (left > -kernel_w) & (left < width)
    buf_h, buf_w = height + 2 * (kernel_h - 1), width + 2 * (kernel_w - 1)
    # fp16/bf16 gradients are summed in fp32 and rounded once at the end
    acc_dtype = torch.float64 if grad_col.dtype == torch.float64 else torch.float32
    buffer = torch.zeros(channels, buf_h * buf_w, dtype=acc_dtype, device=grad_col.device)
    points = touches.nonzero().squeeze(1)
    if points.numel():
        origin = (top[points] + kernel_h - 1) * buf_w + (left[points] + kernel_w - 1)
        rank = _duplicate_rank(origin)
        rounds = [(points[rank == r], origin[rank == r]) for r in range(int(rank.max()) + 1)]
        for t in range(taps):  # same order as the cpu backend: taps, then duplicate rounds
            shift = (t // kernel_w) * buf_w + t % kernel_w
            for pts, org in rounds:
                _scatter_columns(grad_col, t * mask_cnt + pts, org + shift, buffer, accumulate=True)
    inner = (slice(None), slice(kernel_h - 1, kernel_h - 1 + height), slice(kernel_w - 1, kernel_w - 1 + width))
    buffer = buffer.view(channels, buf_h, buf_w)[inner]
    return buffer.unsqueeze(0).to(grad_col.dtype).contiguous()


def col2im_forward(masked_output, mask_h_idx, mask_w_idx, height, width):
    channels = masked_output.shape[0]
    output = torch.zeros(channels, height * width, dtype=masked_output.dtype, device=masked_output.device)
    flat, written = cpu.scatter_targets(mask_h_idx, mask_w_idx, height, width)
    # every point, the unwritten ones with target -1: no compaction, so no host sync for its size
    cols = torch.arange(flat.numel(), device=flat.device)
    _scatter_columns(masked_output.contiguous(), cols, torch.where(written, flat, -1), output, accumulate=False)
    return output.view(1, channels, height, width)


def col2im_backward(grad_output, mask_h_idx, mask_w_idx):
    _, _, height, width = grad_output.shape
    _, written = cpu.scatter_targets(mask_h_idx, mask_w_idx, height, width)
    # Points that were not written read nothing: move them outside the map.
    rows = torch.where(written, mask_h_idx.to(torch.int64), -1)
    return im2col_forward(grad_output, rows, mask_w_idx.to(torch.int64), 1, 1, 0, 0)
