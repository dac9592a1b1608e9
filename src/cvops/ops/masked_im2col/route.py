"""How ``masked_conv2d`` computes on the CPU when no gradient is wanted.

Three routes give the same values (within the accumulating-op tolerance) and exact zeros off the mask:

* *masked*: gather the windows of the mask points (``cpu.im2col_forward``, the kernel behind
  ``masked_im2col``), one ``[O, C*kh*kw] x [C*kh*kw, M]`` product, scatter the columns into a zero map;
* *direct* (numba installed): one compiled loop gathers a few points' windows at a time and takes
  their dot products with the weight rows (``cpu_numba.masked_conv2d_direct``): the least fixed cost,
  for few points;
* *dense*: ``conv2d`` over the whole map, then an exact zero fill off the mask points.

:func:`plan` picks the cheaper one from a cost model of both (fitted to single-thread CPU times of
the GA-RetinaNet head: P3..P7 of an 800x1333 image, 256 -> 80 and 256 -> 4 channels, 3x3). All call
their kernels directly rather than through the custom ops: without autograd and outside
``torch.compile`` the custom-op dispatch only adds a fixed cost, which on the small pyramid levels is
as large as the convolution itself. Under ``torch.compile``, with autograd, other backends or other
dtypes :func:`plan` returns None and ``masked_conv2d`` takes the custom ops.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..._core.jit import numba_kernels
from . import cpu

# Cost model in nanoseconds, per route: a fixed part, then per window element (one of the C*kh*kw
# values of a point's or position's window) a gather part plus a part per output channel.
MASKED_FIXED_NS = 150_000     # point indices, the gather's plan, the product, scatter: about ten torch calls
MASKED_ELEMENT_NS = 1.05      # gather into data_col (channel plane by plane), read back by the product
MASKED_MAC_NS = 0.015         # per multiply-add of the [O, C*kh*kw] x [C*kh*kw, M] product
DIRECT_FIXED_NS = 25_000      # one compiled call (numba installed)
DIRECT_ELEMENT_NS = 0.95      # gather into a per-block buffer
DIRECT_MAC_NS = 0.046         # per multiply-add of the per-point dot products
DENSE_FIXED_NS = 75_000       # conv2d's own set-up on a small map, and the select
DENSE_ELEMENT_NS = 0.28       # per window element of every output position (conv2d's own packing)
DENSE_MAC_NS = 0.016          # per multiply-add of the dense convolution
ROUTES = ("masked", "direct", "dense")


def plan(features: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], out_h: int, out_w: int,
         backend: Optional[str]) -> Optional[tuple[Tensor, str]]:
    """``(keep, route)``: the ``[out_h, out_w]`` bool map of the points to compute and the cheapest of
    :data:`ROUTES`; None where these routes do not apply (then the custom ops run).

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
    out_channels, _, kernel_h, kernel_w = weight.shape
    window = features.shape[1] * kernel_h * kernel_w
    points = int(keep.sum())
    if points == 0:
        return keep, "masked"  # nothing to compute: a zero map
    costs = {"masked": MASKED_FIXED_NS + points * window * (MASKED_ELEMENT_NS + out_channels * MASKED_MAC_NS),
             "dense": DENSE_FIXED_NS + out_h * out_w * window * (DENSE_ELEMENT_NS + out_channels * DENSE_MAC_NS)}
    if numba_kernels(cpu.__package__, features) is not None:
        costs["direct"] = DIRECT_FIXED_NS + points * window * (DIRECT_ELEMENT_NS + out_channels * DIRECT_MAC_NS)
    return keep, min(costs, key=costs.get)


def _output_keep(mask: Tensor, out_h: int, out_w: int) -> Tensor:
    """The mask points inside an ``[out_h, out_w]`` output of another size than the mask; positions
    beyond the mask are off."""
    keep = mask[0, :out_h, :out_w] > 0
    if keep.shape != (out_h, out_w):
        full = torch.zeros((out_h, out_w), dtype=torch.bool)
        full[:keep.shape[0], :keep.shape[1]] = keep
        keep = full
    return keep


def run(name: str, features: Tensor, keep: Tensor, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """Route ``name`` of :data:`ROUTES` at the points of ``keep``."""
    if name == "direct":
        return numba_kernels(cpu.__package__, features).masked_conv2d_direct(features, keep, weight, bias, padding)
    return (dense if name == "dense" else masked)(features, keep, weight, bias, padding)


def dense(features: Tensor, keep: Tensor, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """``conv2d`` everywhere, then the value at every point of ``keep`` and an exact zero elsewhere (a
    fill, not a product, so a NaN or inf off the mask points does not leak into the zeros)."""
    out = torch.nn.functional.conv2d(features, weight, bias, padding=padding)
    return out.masked_fill_(keep.logical_not_(), 0)


def masked(features: Tensor, keep: Tensor, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """The windows of the points of ``keep`` times the weight, scattered into a zero map."""
    out_h, out_w = keep.shape
    out_channels = weight.shape[0]
    out = torch.zeros((1, out_channels, out_h, out_w), dtype=features.dtype)
    flat = keep.view(-1).nonzero().view(-1)  # row-major: distinct, inside the output
    if flat.numel() == 0:
        return out
    data_col = cpu.im2col_forward(features, flat // out_w, flat % out_w, weight.shape[2], weight.shape[3],
                                  padding[0], padding[1])
    values = project(weight.reshape(out_channels, -1), data_col, bias)
    out.view(out_channels, out_h * out_w).index_copy_(1, flat, values)
    return out


def _onednn_matmul_usable(weight_2d: Tensor, data_col: Tensor, bias: Optional[Tensor]) -> bool:
    """oneDNN's fp32 matmul outruns the BLAS one on CPUs where MKL takes its generic path (AMD); it has
    no autograd formula, so it serves inference only."""
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (weight_2d, data_col, bias))
    return (not needs_grad and data_col.device.type == "cpu" and data_col.dtype == torch.float32
            and weight_2d.dtype == torch.float32 and data_col.shape[1] > 0 and weight_2d.shape[0] > 0
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def project(weight_2d: Tensor, data_col: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``bias[:, None] + weight_2d @ data_col`` (mmcv's addmm); ``[O, C*kh*kw] x [C*kh*kw, M] -> [O, M]``."""
    if _onednn_matmul_usable(weight_2d, data_col, bias):
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
