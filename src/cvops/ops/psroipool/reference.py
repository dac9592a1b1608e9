"""psroipool as plain loops, the R-FCN pseudocode of semantics.md §3 and torchvision's bin arithmetic (the test
oracle, never fast).

Coordinates are computed in the accumulation dtype (float32, or float64 for float64 input) one scalar
operation at a time, exactly as R-FCN's ``Dtype`` arithmetic does, and sums accumulate in it.
Tensors are logical NCHW: input ``[N, C, H, W]``, output ``[R, output_dim, PH, PW]``.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..._core.layout import empty_nchw
from . import checks


def round_half_away(v):
    """C ``round()``: halves go away from zero (torch.round goes to even)."""
    t = np.trunc(v)
    if abs(v - t) >= 0.5:
        return t + np.sign(v)
    return t


def to_index(v, limit: int) -> int:
    """An already floored/ceiled bin edge clamped to [0, limit]; NaN gives 0, +inf gives limit."""
    if math.isnan(v):
        return 0
    return int(min(max(v, 0), limit))


def bin_edges(roi, pooled_height: int, pooled_width: int, spatial_scale: float, height: int, width: int, acc,
              convention: str = "rfcn"):
    """Per roi: hs[PH], he[PH], ws[PW], we[PW] as Python ints (arithmetic in ``acc``).

    R-FCN: start = round(x1)*s, size max((round(x2) + 1)*s - start, 0.1), edges floor(p*bin + start) and
    ceil((p+1)*bin + start) clamped to [0, H] / [0, W]. torchvision's forward: start = round(x1*s), size
    max(round(x2*s) - start, 1), edges floor(p*bin) + start and ceil((p+1)*bin) + start clamped to [0, H - 1] /
    [0, W - 1]. ``round`` goes half away from zero, ``bin = size / pooled``."""
    scale, edges = acc(spatial_scale), []
    for c1, c2, bins, limit in ((roi[2], roi[4], pooled_height, height), (roi[1], roi[3], pooled_width, width)):
        with np.errstate(invalid="ignore", over="ignore"):  # a corner may overflow the dtype, or once scaled
            c1, c2 = acc(c1), acc(c2)
            if convention == "torchvision":
                start = round_half_away(c1 * scale)
                size = max(round_half_away(c2 * scale) - start, acc(1))
                shift, offset, limit = acc(0), start, limit - 1
            else:
                start = round_half_away(c1) * scale
                size = (round_half_away(c2) + acc(1)) * scale - start
                size = max(size, acc(0.1)) if not math.isnan(size) else size
                shift, offset = start, acc(0)
            step = size / acc(bins)
            edges.append([to_index(np.floor(acc(p) * step + shift) + offset, limit) for p in range(bins)])
            edges.append([to_index(np.ceil(acc(p + 1) * step + shift) + offset, limit) for p in range(bins)])
    return edges


@np.errstate(invalid="ignore", over="ignore")  # NaN/inf inputs are legal: their sums are the answer
def forward(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
            spatial_scale: float, output_dim: int, out_layout: str = "NCHW", convention: str = "rfcn"):
    """(output [R, od, PH, PW], mapping_channel int32 [R, od, PH, PW]), logical NCHW views."""
    n, c, h, w = input.shape
    r = rois.shape[0]
    ph_n, pw_n = pooled_height, pooled_width
    output = empty_nchw((r, output_dim, ph_n, pw_n), out_layout, like=input, zero=True)
    mapping = empty_nchw((r, output_dim, ph_n, pw_n), out_layout, like=input.new_empty(0, dtype=torch.int32))
    x = input.detach().cpu().to(torch.float64 if input.dtype == torch.float64 else torch.float32).numpy()
    acc = x.dtype.type  # R-FCN's Dtype: float32 (float64 for float64 input)
    rois_np = rois.detach().cpu().double().numpy()
    out_np = np.zeros((r, output_dim, ph_n, pw_n), dtype=acc)
    map_np = np.zeros((r, output_dim, ph_n, pw_n), dtype=np.int32)
    for i in range(r):
        roi = rois_np[i]
        batch = int(roi[0]) if n > 0 else 0
        hs, he, ws, we = bin_edges(roi, ph_n, pw_n, spatial_scale, h, w, acc, convention)
        for ctop in range(output_dim):
            for ph in range(ph_n):
                for pw in range(pw_n):
                    chan = (ctop * ph_n + ph) * pw_n + pw
                    map_np[i, ctop, ph, pw] = chan
                    if he[ph] <= hs[ph] or we[pw] <= ws[pw] or n == 0:
                        continue  # empty bin: 0
                    total = acc(0)
                    for y in range(hs[ph], he[ph]):
                        for xx in range(ws[pw], we[pw]):
                            total = acc(total + x[batch, chan, y, xx])
                    area = acc((he[ph] - hs[ph]) * (we[pw] - ws[pw]))
                    out_np[i, ctop, ph, pw] = total / area
    output.copy_(torch.from_numpy(out_np))
    mapping.copy_(torch.from_numpy(map_np))
    return output, mapping


@np.errstate(invalid="ignore", over="ignore")
def backward(top_grad: torch.Tensor, rois: torch.Tensor, mapping_channel: torch.Tensor, spatial_scale: float,
             output_dim: int, input_shape, out_layout: str = "NCHW", trusted_mapping: bool = False,
             convention: str = "rfcn"):
    """bottom_grad [N, C, H, W] (logical NCHW view): each top element adds grad / bin_area to every
    pixel of its bin in channel ``mapping_channel`` (R-FCN backward, in a fixed order)."""
    n, c, h, w = input_shape
    r, _, ph_n, pw_n = top_grad.shape
    bottom = empty_nchw((n, c, h, w), out_layout, like=top_grad, zero=True)
    if top_grad.numel() == 0 or bottom.numel() == 0:
        return bottom
    checks.check_mapping_values(checks.OP_BACKWARD, mapping_channel, c)
    g = top_grad.detach().cpu().to(torch.float64 if top_grad.dtype == torch.float64 else torch.float32).numpy()
    acc = g.dtype.type
    maps = mapping_channel.detach().cpu().numpy()
    rois_np = rois.detach().cpu().double().numpy()
    grad_np = np.zeros((n, c, h, w), dtype=acc)
    for i in range(r):
        roi = rois_np[i]
        batch = int(roi[0])
        hs, he, ws, we = bin_edges(roi, ph_n, pw_n, spatial_scale, h, w, acc, convention)
        for ctop in range(output_dim):
            for ph in range(ph_n):
                for pw in range(pw_n):
                    if he[ph] <= hs[ph] or we[pw] <= ws[pw]:
                        continue
                    chan = int(maps[i, ctop, ph, pw])
                    area = acc((he[ph] - hs[ph]) * (we[pw] - ws[pw]))
                    diff = acc(g[i, ctop, ph, pw] / area)
                    for y in range(hs[ph], he[ph]):
                        for xx in range(ws[pw], we[pw]):
                            grad_np[batch, chan, y, xx] = acc(grad_np[batch, chan, y, xx] + diff)
    bottom.copy_(torch.from_numpy(grad_np))
    return bottom
