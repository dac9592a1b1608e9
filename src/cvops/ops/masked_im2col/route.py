"""How ``masked_conv2d`` computes on the CPU when no gradient is wanted.

Four routes give the same values (within the accumulating-op tolerance) and exact zeros off the mask:

* *masked*: gather the windows of the mask points (``cpu.im2col_forward``, the kernel behind
  ``masked_im2col``), one ``[O, C*kh*kw] x [C*kh*kw, M]`` product, scatter the columns into a zero map;
* *direct* (numba installed): one compiled loop gathers a few points' windows at a time and takes
  their dot products with the weight rows (``cpu_numba.masked_conv2d_direct``): the least fixed cost,
  for few points;
* *taps*: every tap's weight times the whole map, ``[kh*kw*O, C] x [C, H*W]`` (no window gather), then
  per point the sum of its window's taps: the dense convolution's multiply-adds at the matmul's rate,
  the cheapest for few output channels;
* *dense*: ``conv2d`` over the whole map, then an exact zero fill off the mask points.

:func:`plan` picks the cheapest from a cost model of each (fitted to single-thread CPU times of the
GA-RetinaNet head with numba installed: P3..P7 of an 800x1333 image, 256 -> 80 and 256 -> 4 channels,
3x3, 10% and 30% of the positions masked). All call
their kernels directly rather than through the custom ops: without autograd and outside
``torch.compile`` the custom-op dispatch only adds a fixed cost, which on the small pyramid levels is
as large as the convolution itself. Under ``torch.compile``, with autograd, other backends or other
dtypes :func:`plan` returns None and ``masked_conv2d`` takes the custom ops.
"""
from __future__ import annotations

import weakref
from contextlib import suppress
from types import ModuleType
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from ..._core.jit import KernelNotReady, numba_kernels
from . import cpu

# Cost model in nanoseconds, per route: a fixed part (the whole call's, argument checks included), then
# per window element (one of the C*kh*kw values of a point's or position's window) a gather part plus a
# part per output channel.
MASKED_FIXED_NS = 210_000     # point indices, the gather's plan, the product, scatter: about ten torch calls
MASKED_ELEMENT_NS = 1.05      # gather into data_col (channel plane by plane), read back by the product
MASKED_MAC_NS = 0.015         # per multiply-add of the [O, C*kh*kw] x [C*kh*kw, M] product
DIRECT_FIXED_NS = 90_000      # one compiled call (numba installed)
DIRECT_ELEMENT_NS = 0.95      # gather into a per-block buffer
DIRECT_MAC_NS = 0.046         # per multiply-add of the per-point dot products
TAPS_FIXED_NS = 80_000        # one product, the tap sum call
TAPS_MAC_NS = 0.02            # per multiply-add of the [kh*kw*O, C] x [C, H*W] product
TAPS_POINT_NS = 1.0           # per (point, tap, output channel) of the tap sum
DENSE_FIXED_NS = 110_000      # conv2d's own set-up on a small map, and the select
DENSE_ELEMENT_NS = 0.28       # per window element of every output position (conv2d's own packing)
DENSE_MAC_NS = 0.016          # per multiply-add of the dense convolution
ROUTES = ("masked", "direct", "taps", "dense")


class Plan(NamedTuple):
    """What :func:`plan` chose: the route, the ``[out_h, out_w]`` bool map of the points to compute,
    their flat indices ``h*out_w + w`` (ascending) and the compiled kernels (None without numba)."""

    route: str
    keep: Tensor
    points: Tensor
    fused: Optional[ModuleType]


def plan(features: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], out_h: int, out_w: int,
         backend: Optional[str]) -> Optional[Plan]:
    """The cheapest of :data:`ROUTES` for this call, or None where these routes do not apply (then the
    custom ops run).

    Applies to CPU float32/float64 with the default or cpu backend, without autograd (the weight
    gradient of the dense route would sum over every position, so a non-finite feature value off the
    mask points would reach it) and not while torch.compile traces (the point count is data-dependent)."""
    if (features.device.type != "cpu" or backend not in (None, "cpu")
            or features.dtype not in (torch.float32, torch.float64) or torch.compiler.is_compiling()):
        return None
    if torch.is_grad_enabled() and (features.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return None
    if mask.shape[1] == out_h and mask.shape[2] == out_w:
        keep = mask[0] > 0
    else:
        keep = _output_keep(mask, out_h, out_w)
    flat = keep.reshape(-1).nonzero().view(-1)  # row-major (a strided mask too): distinct, inside the output
    fused = numba_kernels(cpu.__package__, features, background=True)
    points = flat.shape[0]
    if points == 0:
        return Plan("masked", keep, flat, fused)  # nothing to compute: a zero map
    out_channels, channels, kernel_h, kernel_w = weight.shape
    taps_count = kernel_h * kernel_w
    window = channels * taps_count
    costs = {"masked": MASKED_FIXED_NS + points * window * (MASKED_ELEMENT_NS + out_channels * MASKED_MAC_NS),
             "dense": DENSE_FIXED_NS + out_h * out_w * window * (DENSE_ELEMENT_NS + out_channels * DENSE_MAC_NS),
             "taps": (TAPS_FIXED_NS + features.shape[2] * features.shape[3] * window * out_channels * TAPS_MAC_NS
                      + points * taps_count * out_channels * TAPS_POINT_NS)}
    if fused is not None:
        costs["direct"] = DIRECT_FIXED_NS + points * window * (DIRECT_ELEMENT_NS + out_channels * DIRECT_MAC_NS)
    return Plan(min(costs, key=costs.get), keep, flat, fused)


def _output_keep(mask: Tensor, out_h: int, out_w: int) -> Tensor:
    """The mask points inside an ``[out_h, out_w]`` output of another size than the mask; positions
    beyond the mask are off."""
    keep = mask[0, :out_h, :out_w] > 0
    if keep.shape != (out_h, out_w):
        full = torch.zeros((out_h, out_w), dtype=torch.bool)
        full[:keep.shape[0], :keep.shape[1]] = keep
        keep = full
    return keep


def run(chosen: Plan, features: Tensor, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """The route of ``chosen`` at its points: ``[1, O, out_h, out_w]``, exact zeros off the points."""
    if chosen.route == "dense":
        out = torch.nn.functional.conv2d(features, weight, bias, padding=padding)
        return out.masked_fill_(chosen.keep.logical_not_(), 0)  # a fill: a NaN off the points does not leak
    if chosen.route == "direct":
        with suppress(KernelNotReady):
            return chosen.fused.masked_conv2d_direct(features, chosen.points, chosen.keep.shape, weight, bias,
                                                     padding)
        return masked(features, chosen, weight, bias, padding)  # the same points, without the direct kernel
    if chosen.route == "taps":
        return taps(features, chosen, weight, bias, padding)
    return masked(features, chosen, weight, bias, padding)


def masked(features: Tensor, chosen: Plan, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """The windows of the points times the weight, scattered into a zero map."""
    out_h, out_w = chosen.keep.shape
    out_channels = weight.shape[0]
    out = torch.zeros((1, out_channels, out_h, out_w), dtype=features.dtype)
    flat = chosen.points
    if flat.numel() == 0:
        return out
    data_col = cpu.im2col_forward(features, flat // out_w, flat % out_w, weight.shape[2], weight.shape[3],
                                  padding[0], padding[1])
    values = project(weight.reshape(out_channels, -1), data_col, bias)
    out.view(out_channels, out_h * out_w).index_copy_(1, flat, values)
    return out


# tap-major copies of the weights the taps route has seen (by id, with a weak reference to tell a
# new tensor at a reused address apart), reused while the weight is unchanged
_TAP_WEIGHTS: dict = {}
_TAP_WEIGHTS_KEPT = 16


def _tap_weight(weight: Tensor) -> Tensor:
    """``weight [O, C, kh, kw]`` as ``[kh*kw*O, C]`` (row ``(i*kw + j)*O + o``). The copy is kept per
    weight tensor (a module's parameter is the same tensor on every call) and made again when the
    weight changed in place (its version counter moved)."""
    kept = _TAP_WEIGHTS.get(id(weight))
    if kept is not None and kept[0]() is weight and kept[1] == weight._version:
        return kept[2]
    out_channels, channels, kernel_h, kernel_w = weight.shape
    tap_weight = weight.permute(2, 3, 0, 1).reshape(kernel_h * kernel_w * out_channels, channels).contiguous()
    for key in [k for k, v in _TAP_WEIGHTS.items() if v[0]() is None]:  # weights gone
        del _TAP_WEIGHTS[key]
    if len(_TAP_WEIGHTS) >= _TAP_WEIGHTS_KEPT:
        _TAP_WEIGHTS.pop(next(iter(_TAP_WEIGHTS)))
    _TAP_WEIGHTS[id(weight)] = (weakref.ref(weight), weight._version, tap_weight)
    return tap_weight


SMALL_MAP = 1024  # positions below which BLAS's product beats oneDNN's set-up in the taps route


def taps(features: Tensor, chosen: Plan, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """Every tap's weight times every feature position, ``[kh*kw*O, C] x [C, H*W]`` (a plain product on
    the map as it is stored: no window gather), then per point the sum of its window's taps. The
    product costs what the dense convolution costs in multiply-adds, but runs at the matmul's rate, so
    for few output channels (GA-RetinaNet's 4-channel loc branch) it is cheaper than ``conv2d``."""
    _, channels, height, width = features.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    tap_weight = _tap_weight(weight)
    plane = features.reshape(channels, height * width)
    products = tap_weight.mm(plane) if height * width < SMALL_MAP else project(tap_weight, plane, None)
    if chosen.fused is not None:
        with suppress(KernelNotReady):
            return chosen.fused.tap_sum(products, chosen.points, chosen.keep.shape, bias, (kernel_h, kernel_w),
                                        padding, height, width)
    out_h, out_w = chosen.keep.shape
    pad_h, pad_w = padding
    shifted = torch.nn.functional.pad(products.view(-1, height, width), (pad_w, pad_w, pad_h, pad_h))
    shifted = shifted.view(kernel_h, kernel_w, out_channels, height + 2 * pad_h, width + 2 * pad_w)
    out = torch.zeros((out_channels, out_h, out_w), dtype=features.dtype) if bias is None else \
        bias.view(out_channels, 1, 1).expand(out_channels, out_h, out_w).clone()
    for i in range(kernel_h):
        for j in range(kernel_w):
            out += shifted[i, j, :, i:i + out_h, j:j + out_w]
    return out.masked_fill_(chosen.keep.logical_not_(), 0).unsqueeze(0)


def _onednn_matmul_usable(weight_2d: Tensor, data_col: Tensor, bias: Optional[Tensor]) -> bool:
    """oneDNN's fp32 matmul outruns the BLAS one on CPUs where MKL takes its generic path (AMD); it has
    no autograd formula, so it serves inference only."""
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (weight_2d, data_col, bias))
    return (not needs_grad and data_col.device.type == "cpu" and data_col.dtype == torch.float32
            and weight_2d.dtype == torch.float32 and data_col.shape[1] > 0 and weight_2d.shape[0] > 0
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


# On more than one thread oneDNN's product time steps up just past 64 points (data_col's M: it hands
# out the points in blocks) and BLAS's catches up again near 100; in between, with many output channels,
# BLAS is the faster (with few, oneDNN stays far ahead).
BLAS_POINTS = (65, 100)
BLAS_MIN_OUT = 16


def _blas_faster(weight_2d: Tensor, data_col: Tensor) -> bool:
    return (BLAS_POINTS[0] <= data_col.shape[1] < BLAS_POINTS[1] and weight_2d.shape[0] >= BLAS_MIN_OUT
            and torch.get_num_threads() > 1)


def project(weight_2d: Tensor, data_col: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``bias[:, None] + weight_2d @ data_col`` (mmcv's addmm); ``[O, C*kh*kw] x [C*kh*kw, M] -> [O, M]``
    (a transposed view where BLAS runs it)."""
    if _onednn_matmul_usable(weight_2d, data_col, bias):
        if _blas_faster(weight_2d, data_col):
            # through linear (the points as rows): over this range no slower than addmm
            return torch.nn.functional.linear(data_col.t(), weight_2d, bias).t()
        try:  # "weight" = data_col^T, a free view: the product comes out as [O, M]
            out = torch.ops.mkldnn._linear_pointwise(weight_2d.contiguous(), data_col.t(), None, "none", [], "")
            return out if bias is None else out.add_(bias[:, None])
        except (RuntimeError, TypeError):  # a torch build whose oneDNN op differs or refuses: BLAS below
            pass
    if torch.compiler.is_compiling():
        # the data-dependent M: aten's mm/addmm backward guards on its strides under torch.compile, einsum's not
        out = torch.einsum("ok,km->om", weight_2d, data_col)
        return out if bias is None else out + bias[:, None]
    if bias is None:
        return weight_2d.mm(data_col)
    return torch.addmm(bias[:, None], weight_2d, data_col)
