"""carafe Triton kernels. Strides are arguments, so one kernel serves NCHW and NHWC.

- forward: one program per tile of (output pixels x channels) walks the k*k taps;
- grad_input: one program per tile of (input pixels x channels) *gathers* from the output blocks whose
  window covers the pixel, in a fixed order: deterministic, no atomics;
- grad_mask: one program per (mask channel, tile of output pixels) reduces gy * x over the group.

Offsets are int32 where every span fits (``_core.indexing``), else int64 (``INDEX_64``). Accumulators
are float32 (float64 for float64); 16 x 32 tiles on 4 warps keep them within ``REGISTER_BUDGET``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._core.indexing import needs_int64
from ..._core.layout import empty_nchw

REGISTER_BUDGET = 128

BLOCK_P = 16
BLOCK_C = 32
NUM_WARPS = 4


@triton.jit
def _program_ids(INDEX_64: tl.constexpr):
    """(batch, axis-0, axis-1) program ids, widened to int64 in the large-tensor variant."""
    n = tl.program_id(2)
    p0 = tl.program_id(0)
    p1 = tl.program_id(1)
    if INDEX_64:
        n = n.to(tl.int64)
        p0 = p0.to(tl.int64)
        p1 = p1.to(tl.int64)
    return n, p0, p1


@triton.jit
def _carafe_forward_kernel(x_ptr, m_ptr, out_ptr, C, H, W, OW, OHW, Cg, K, R, S,
                           xs_n, xs_c, xs_h, xs_w, ms_n, ms_c, ms_h, ms_w, os_n, os_c, os_h, os_w,
                           IS_F64: tl.constexpr, INDEX_64: tl.constexpr, BLOCK_P: tl.constexpr,
                           BLOCK_C: tl.constexpr):
    n, pid_p, pid_c = _program_ids(INDEX_64)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    live_p = offs_p < OHW
    live_c = offs_c < C
    oy = offs_p // OW
    ox = offs_p % OW
    iy0 = oy // S
    ix0 = ox // S
    g = offs_c // Cg
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float64 if IS_F64 else tl.float32)
    x_base = x_ptr + n * xs_n + offs_c[None, :] * xs_c
    m_base = m_ptr + n * ms_n + oy[:, None] * ms_h + ox[:, None] * ms_w
    for ky in range(0, K):
        iy = iy0 + ky - R
        row_ok = live_p & (iy >= 0) & (iy < H)
        for kx in range(0, K):
            ix = ix0 + kx - R
            ok = (row_ok & (ix >= 0) & (ix < W))[:, None] & live_c[None, :]
            xv = tl.load(x_base + iy[:, None] * xs_h + ix[:, None] * xs_w, mask=ok, other=0.0)
            mc = (g * K + ky) * K + kx
            mv = tl.load(m_base + mc[None, :] * ms_c, mask=ok, other=0.0)
            acc += xv.to(acc.dtype) * mv.to(acc.dtype)
    out = out_ptr + n * os_n + offs_c[None, :] * os_c + oy[:, None] * os_h + ox[:, None] * os_w
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=live_p[:, None] & live_c[None, :])


@triton.jit
def _carafe_grad_input_kernel(gy_ptr, m_ptr, gx_ptr, C, H, W, HW, Cg, K, R, S,
                              gs_n, gs_c, gs_h, gs_w, ms_n, ms_c, ms_h, ms_w, xs_n, xs_c, xs_h, xs_w,
                              IS_F64: tl.constexpr, INDEX_64: tl.constexpr, BLOCK_P: tl.constexpr,
                              BLOCK_C: tl.constexpr):
    n, pid_p, pid_c = _program_ids(INDEX_64)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    live_p = offs_p < HW
    live_c = offs_c < C
    iy = offs_p // W
    ix = offs_p % W
    g = offs_c // Cg
    acc = tl.zeros([BLOCK_P, BLOCK_C], dtype=tl.float64 if IS_F64 else tl.float32)
    gy_base = gy_ptr + n * gs_n + offs_c[None, :] * gs_c
    m_base = m_ptr + n * ms_n
    # one flat loop over (ky, kx, py, px), in that nesting order: nested loops made ptxas keep (and spill)
    # a set of strength-reduced addresses per level
    subs = S * S
    for t in range(0, K * K * subs):
        tap = t // subs
        sub = t % subs
        ky = tap // K
        kx = tap % K
        by = iy - ky + R          # input-resolution block (row, col) whose window reads (iy, ix) at this tap
        bx = ix - kx + R
        ok = (live_p & (by >= 0) & (by < H) & (bx >= 0) & (bx < W))[:, None] & live_c[None, :]
        oy = by * S + sub // S
        ox = bx * S + sub % S
        mc = (g * K + ky) * K + kx
        gv = tl.load(gy_base + oy[:, None] * gs_h + ox[:, None] * gs_w, mask=ok, other=0.0)
        mv = tl.load(m_base + mc[None, :] * ms_c + oy[:, None] * ms_h + ox[:, None] * ms_w, mask=ok, other=0.0)
        acc += gv.to(acc.dtype) * mv.to(acc.dtype)
    out = gx_ptr + n * xs_n + offs_c[None, :] * xs_c + iy[:, None] * xs_h + ix[:, None] * xs_w
    tl.store(out, acc.to(gx_ptr.dtype.element_ty), mask=live_p[:, None] & live_c[None, :])


@triton.jit
def _carafe_grad_mask_kernel(gy_ptr, x_ptr, gm_ptr, H, W, OW, OHW, Cg, K, R, S,
                             gs_n, gs_c, gs_h, gs_w, xs_n, xs_c, xs_h, xs_w, ms_n, ms_c, ms_h, ms_w,
                             IS_F64: tl.constexpr, INDEX_64: tl.constexpr, BLOCK_P: tl.constexpr,
                             BLOCK_C: tl.constexpr):
    n, pid_p, mc = _program_ids(INDEX_64)   # mc: mask channel (g*K + ky)*K + kx
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    live_p = offs_p < OHW
    g = mc // (K * K)
    tap = mc % (K * K)
    oy = offs_p // OW
    ox = offs_p % OW
    iy = oy // S + tap // K - R
    ix = ox // S + tap % K - R
    ok_p = live_p & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
    acc = tl.zeros([BLOCK_P], dtype=tl.float64 if IS_F64 else tl.float32)
    lanes = tl.arange(0, BLOCK_C)
    for c0 in range(0, Cg, BLOCK_C):
        cc = g * Cg + c0 + lanes
        ok = ok_p[:, None] & ((c0 + lanes) < Cg)[None, :]
        gv = tl.load(gy_ptr + n * gs_n + cc[None, :] * gs_c + oy[:, None] * gs_h + ox[:, None] * gs_w,
                     mask=ok, other=0.0)
        xv = tl.load(x_ptr + n * xs_n + cc[None, :] * xs_c + iy[:, None] * xs_h + ix[:, None] * xs_w,
                     mask=ok, other=0.0)
        acc += tl.sum(gv.to(acc.dtype) * xv.to(acc.dtype), axis=1)
    out = gm_ptr + n * ms_n + mc * ms_c + oy * ms_h + ox * ms_w
    tl.store(out, acc.to(gm_ptr.dtype.element_ty), mask=live_p)


def forward(features: torch.Tensor, masks: torch.Tensor, kernel_size: int, group_size: int,
            scale_factor: int, layout: str = "NCHW") -> torch.Tensor:
    n, c, h, w = features.shape
    s, k = scale_factor, kernel_size
    out = empty_nchw((n, c, h * s, w * s), layout, like=features)
    index_64 = needs_int64(features, masks, out, h * s * w * s + BLOCK_P, c + BLOCK_C)
    grid = (triton.cdiv(h * s * w * s, BLOCK_P), triton.cdiv(c, BLOCK_C), n)
    _carafe_forward_kernel[grid](features, masks, out, c, h, w, w * s, h * s * w * s, c // group_size, k,
                                 (k - 1) // 2, s, *features.stride(), *masks.stride(), *out.stride(),
                                 IS_F64=features.dtype == torch.float64, INDEX_64=index_64,
                                 BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
    return out


def backward(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor, kernel_size: int,
             group_size: int, scale_factor: int, layout: str = "NCHW"):
    n, c, h, w = features.shape
    s, k = scale_factor, kernel_size
    is_f64 = features.dtype == torch.float64
    grad_input = empty_nchw((n, c, h, w), layout, like=features)
    grad_mask = empty_nchw(tuple(masks.shape), layout, like=masks)
    index_64 = needs_int64(grad_output, features, masks, h * s * w * s + BLOCK_P, c + BLOCK_C)
    grid = (triton.cdiv(h * w, BLOCK_P), triton.cdiv(c, BLOCK_C), n)
    _carafe_grad_input_kernel[grid](grad_output, masks, grad_input, c, h, w, h * w, c // group_size, k,
                                    (k - 1) // 2, s, *grad_output.stride(), *masks.stride(),
                                    *grad_input.stride(), IS_F64=is_f64, INDEX_64=index_64,
                                    BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
    grid = (triton.cdiv(h * s * w * s, BLOCK_P), group_size * k * k, n)
    _carafe_grad_mask_kernel[grid](grad_output, features, grad_mask, h, w, w * s, h * s * w * s,
                                   c // group_size, k, (k - 1) // 2, s, *grad_output.stride(),
                                   *features.stride(), *grad_mask.stride(), IS_F64=is_f64, INDEX_64=index_64,
                                   BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
    return grad_input, grad_mask
