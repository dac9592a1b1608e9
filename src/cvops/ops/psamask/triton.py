"""psamask Triton kernels: one program per block of destination elements in the destination's memory order
(coalesced stores), each loading its source or writing 0; strides are arguments (NCHW and NHWC alike).
Index arithmetic is int32 where every offset fits (``_core.indexing``), else int64. A 4-warp program moves
``BLOCK`` elements: few enough registers that an SM keeps half its warps resident to hide the gathers.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..._core.indexing import needs_int64
from ..._core.layout import empty_nchw
from .checks import COLLECT

BLOCK = 512
BLOCK_64 = 256   # int64 values take two registers each: half the elements per thread
NUM_WARPS = 4


@triton.jit
def _block_offsets(INDEX_64: tl.constexpr, BLOCK: tl.constexpr):
    """This program's linear offsets, int64 for the large-tensor variant, int32 otherwise."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    return pid * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def _decode(offs, C, H, W, CHANNELS_LAST: tl.constexpr):
    """(n, c, h, w) of linear offsets in NCHW or NHWC memory order."""
    if CHANNELS_LAST:
        c = offs % C
        rest = offs // C
        w = rest % W
        rest = rest // W
        h = rest % H
        n = rest // H
    else:
        w = offs % W
        rest = offs // W
        h = rest % H
        rest = rest // H
        c = rest % C
        n = rest // C
    return n, c, h, w


@triton.jit
def _psamask_forward_kernel(x_ptr, out_ptr, total, H, W, h_mask, w_mask, half_h, half_w,
                            xs_n, xs_c, xs_h, xs_w, os_n, os_c, os_h, os_w,
                            COLLECT_MODE: tl.constexpr, CHANNELS_LAST: tl.constexpr, INDEX_64: tl.constexpr,
                            BLOCK: tl.constexpr):
    offs = _block_offsets(INDEX_64, BLOCK)
    live = offs < total
    n, c, h, w = _decode(offs, H * W, H, W, CHANNELS_LAST)
    if COLLECT_MODE:   # out[n, q=c, p=(h, w)]
        qh, qw, ph, pw = c // W, c % W, h, w
    else:              # out[n, p=c, q=(h, w)]
        qh, qw, ph, pw = h, w, c // W, c % W
    dh = qh - ph + half_h
    dw = qw - pw + half_w
    inside = (dh >= 0) & (dh < h_mask) & (dw >= 0) & (dw < w_mask)
    src = n * xs_n + (dh * w_mask + dw) * xs_c + ph * xs_h + pw * xs_w
    value = tl.load(x_ptr + src, mask=live & inside, other=0)
    tl.store(out_ptr + n * os_n + c * os_c + h * os_h + w * os_w, value, mask=live)


@triton.jit
def _psamask_backward_kernel(dy_ptr, dx_ptr, total, H, W, h_mask, w_mask, half_h, half_w,
                             ys_n, ys_c, ys_h, ys_w, xs_n, xs_c, xs_h, xs_w,
                             COLLECT_MODE: tl.constexpr, CHANNELS_LAST: tl.constexpr, INDEX_64: tl.constexpr,
                             BLOCK: tl.constexpr):
    offs = _block_offsets(INDEX_64, BLOCK)
    live = offs < total
    n, m, ph, pw = _decode(offs, h_mask * w_mask, H, W, CHANNELS_LAST)
    qh = ph + m // w_mask - half_h
    qw = pw + m % w_mask - half_w
    inside = (qh >= 0) & (qh < H) & (qw >= 0) & (qw < W)
    if COLLECT_MODE:   # dy[n, q, p]
        src = n * ys_n + (qh * W + qw) * ys_c + ph * ys_h + pw * ys_w
    else:              # dy[n, p, q]
        src = n * ys_n + (ph * W + pw) * ys_c + qh * ys_h + qw * ys_w
    value = tl.load(dy_ptr + src, mask=live & inside, other=0)
    tl.store(dx_ptr + n * xs_n + m * xs_c + ph * xs_h + pw * xs_w, value, mask=live)


def _launch(kernel, src, dst, psa_type, h_mask, w_mask, layout):
    n, _, h, w = src.shape
    total = dst.numel()
    index_64 = needs_int64(src, dst, total + BLOCK)
    block = BLOCK_64 if index_64 else BLOCK
    kernel[(triton.cdiv(total, block),)](
        src, dst, total, h, w, h_mask, w_mask, (h_mask - 1) // 2, (w_mask - 1) // 2,
        *src.stride(), *dst.stride(),
        COLLECT_MODE=psa_type == COLLECT, CHANNELS_LAST=layout == "NHWC",
        INDEX_64=index_64, BLOCK=block, num_warps=NUM_WARPS)
    return dst


def forward(x, psa_type, h_mask, w_mask, layout, out=None):
    n, _, h, w = x.shape
    out = empty_nchw((n, h * w, h, w), layout, like=x) if out is None else out
    return _launch(_psamask_forward_kernel, x, out, psa_type, h_mask, w_mask, layout)


def backward(dy, psa_type, h_mask, w_mask, layout, out=None):
    n, _, h, w = dy.shape
    dx = empty_nchw((n, h_mask * w_mask, h, w), layout, like=dy) if out is None else out
    return _launch(_psamask_backward_kernel, dy, dx, psa_type, h_mask, w_mask, layout)
