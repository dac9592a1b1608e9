"""psroipool Triton kernels, on the bin edges of ``cpu.bin_edges`` (the same pixels as every backend).

forward: one program per (RoI, bin) and block of ``output_dim`` channels walks the bin's pixels, accumulating
in fp32 (fp64 for float64). backward: a gather (no atomics, a fixed order): one program per input pixel and
block of channels adds, RoI by RoI, ``grad / area`` of the bin that owns the channel and covers the pixel, so
it needs the forward's ``mapping_channel`` (any other is rejected here). Offsets are int32 where every span
fits (``_core.indexing``), else int64 (an ``INDEX_64`` variant).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._core.errors import NotSupportedError
from ..._core.indexing import needs_int64
from ..._core.sync import check_values
from ..._core.layout import empty_nchw
from . import checks, cpu
from .cpu import _is_canonical, bin_edges, compute_dtype


@triton.jit
def _psroi_pool_forward_kernel(x_ptr, hs_ptr, he_ptr, ws_ptr, we_ptr, batch_ptr, out_ptr, map_ptr,
                               PH, PW, OD, xs_n, xs_c, xs_h, xs_w, os_r, os_c, os_h, os_w,
                               ms_r, ms_c, ms_h, ms_w,
                               ACC_F64: tl.constexpr, INDEX_64: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    pw = pid % PW
    ph = (pid // PW) % PH
    r = pid // (PW * PH)
    hs = tl.load(hs_ptr + r * PH + ph)
    he = tl.load(he_ptr + r * PH + ph)
    ws = tl.load(ws_ptr + r * PW + pw)
    we = tl.load(we_ptr + r * PW + pw)
    b = tl.load(batch_ptr + r)
    if INDEX_64:
        b = b.to(tl.int64)
    ctop = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    live = ctop < OD
    chan = (ctop * PH + ph) * PW + pw
    if ACC_F64:
        acc = tl.zeros([BLOCK_C], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    zero = b * 0  # loop counters may be plain ints: adding this zero gives them the index width
    src = x_ptr + b * xs_n + (chan + zero) * xs_c
    for h in range(hs, he):
        for w in range(ws, we):
            v = tl.load(src + (h + zero) * xs_h + (w + zero) * xs_w, mask=live, other=0.0)
            acc += v.to(acc.dtype)
    area = (he - hs) * (we - ws)
    mean = tl.where(area > 0, acc / tl.maximum(area, 1).to(acc.dtype), 0.0)
    ri = r + zero
    ci = ctop + zero
    tl.store(out_ptr + ri * os_r + ci * os_c + ph * os_h + pw * os_w, mean.to(out_ptr.dtype.element_ty), mask=live)
    tl.store(map_ptr + ri * ms_r + ci * ms_c + ph * ms_h + pw * ms_w, chan, mask=live)


@triton.jit
def _psroi_pool_backward_kernel(g_ptr, hs_ptr, he_ptr, ws_ptr, we_ptr, batch_ptr, out_ptr,
                                R, PH, PW, C, H, W, gs_r, gs_c, gs_h, gs_w, os_n, os_c, os_h, os_w,
                                ACC_F64: tl.constexpr, INDEX_64: tl.constexpr, BLOCK_C: tl.constexpr):
    pix = tl.program_id(0)
    w = pix % W
    h = (pix // W) % H
    n = pix // (W * H)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    live = c < C
    groups = PH * PW
    ctop = c // groups
    ph = (c % groups) // PW
    pw = c % PW
    if ACC_F64:
        acc = tl.zeros([BLOCK_C], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    zero = n * 0  # the loop counter may be a plain int: adding this zero gives it the index width
    if INDEX_64:
        zero = zero.to(tl.int64)
    for r in range(0, R):
        if tl.load(batch_ptr + r) == n:
            hs = tl.load(hs_ptr + r * PH + ph, mask=live, other=0)
            he = tl.load(he_ptr + r * PH + ph, mask=live, other=0)
            ws = tl.load(ws_ptr + r * PW + pw, mask=live, other=0)
            we = tl.load(we_ptr + r * PW + pw, mask=live, other=0)
            inside = live & (hs <= h) & (h < he) & (ws <= w) & (w < we)
            g = tl.load(g_ptr + (r + zero) * gs_r + (ctop + zero) * gs_c + ph * gs_h + pw * gs_w,
                        mask=inside, other=0.0).to(acc.dtype)
            area = tl.maximum((he - hs) * (we - ws), 1).to(acc.dtype)
            acc += tl.where(inside, g / area, 0.0)
    dst = out_ptr + (n + zero) * os_n + (c + zero) * os_c + (h + zero) * os_h + (w + zero) * os_w
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=live)


_NOT_CANONICAL = ("the triton backend needs the forward's mapping_channel (channel (ctop*PH + ph)*PW + pw); "
                  "use backend='torch' or 'numba' for any other mapping")


def _check_canonical(mapping_channel: torch.Tensor, channels: int) -> None:
    checks.check_mapping_values(checks.OP_BACKWARD, mapping_channel, channels)
    if not _is_canonical(mapping_channel):
        raise NotSupportedError(checks.OP_BACKWARD, _NOT_CANONICAL)


def _edges_int32(rois, ph, pw, spatial_scale, h, w, dtype, convention):
    hs, he, ws, we, batch = bin_edges(rois, ph, pw, spatial_scale, h, w, compute_dtype(dtype), convention)
    return [t.to(torch.int32).contiguous() for t in (hs, he, ws, we, batch)]


def _block(n: int) -> int:
    return min(max(triton.next_power_of_2(n), 16), 256)


def forward(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
            spatial_scale: float, output_dim: int, out_layout: str = "NCHW", convention: str = "rfcn"):
    if input.numel() == 0 or rois.shape[0] == 0:  # nothing to pool: the torch code writes the mapping and zeros
        return cpu.forward(input, rois, pooled_height, pooled_width, spatial_scale, output_dim, out_layout,
                           convention)
    n, c, h, w = input.shape
    r, shape = rois.shape[0], (rois.shape[0], output_dim, pooled_height, pooled_width)
    output = empty_nchw(shape, out_layout, like=input)
    mapping = empty_nchw(shape, out_layout, like=input.new_empty(0, dtype=torch.int32))
    hs, he, ws, we, batch = _edges_int32(rois, pooled_height, pooled_width, spatial_scale, h, w, input.dtype,
                                         convention)
    block = _block(output_dim)
    grid = (r * pooled_height * pooled_width, triton.cdiv(output_dim, block))
    _psroi_pool_forward_kernel[grid](
        input, hs, he, ws, we, batch, output, mapping, pooled_height, pooled_width, output_dim,
        *input.stride(), *output.stride(), *mapping.stride(),
        ACC_F64=input.dtype == torch.float64, INDEX_64=needs_int64(input, output, mapping), BLOCK_C=block)
    return output, mapping


def backward(top_grad: torch.Tensor, rois: torch.Tensor, mapping_channel: torch.Tensor, spatial_scale: float,
             output_dim: int, input_shape, out_layout: str = "NCHW", trusted_mapping: bool = False,
             convention: str = "rfcn"):
    n, c, h, w = input_shape
    r, od, ph, pw = top_grad.shape
    bottom = empty_nchw((n, c, h, w), out_layout, like=top_grad)
    if top_grad.numel() == 0 or bottom.numel() == 0:
        return bottom.zero_()
    if not trusted_mapping:
        check_values(mapping_channel, lambda: _check_canonical(mapping_channel, c),
                     lambda: _is_canonical(mapping_channel), f"{checks.OP_BACKWARD}: {_NOT_CANONICAL}")
    hs, he, ws, we, batch = _edges_int32(rois, ph, pw, spatial_scale, h, w, top_grad.dtype, convention)
    block = _block(c)
    grid = (n * h * w, triton.cdiv(c, block))
    _psroi_pool_backward_kernel[grid](
        top_grad, hs, he, ws, we, batch, bottom, r, ph, pw, c, h, w, *top_grad.stride(), *bottom.stride(),
        ACC_F64=top_grad.dtype == torch.float64, INDEX_64=needs_int64(top_grad, bottom), BLOCK_C=block)
    return bottom
