"""How ``masked_conv2d`` computes on the CPU: two routes, one rule that counts their work.

* *gather*: ``masked_im2col`` of the windows of the M output points to compute (K = C*kh*kw values
  each), one ``[O, K] x [K, M]`` product, its columns copied into a zero map. Work: 2*O*K*M flops, and
  K*M window values moved through memory (written by the gather and read by the product; the
  backward moves them again, scattering their gradients).
* *dense*: ``conv2d`` over all P = out_h*out_w output positions, then exact zeros filled in off the
  points. Work: 2*O'*K*P flops with O' = max(O, one vector of output channels: the convolution computes
  them a vector at a time), and nothing gathered. Its backward is the dense convolution's backward of the
  masked gradient.

Counting one moved value as :data:`MOVE_FLOPS` flops and the gather route's extra fixed cost as
:data:`CALL_FLOPS`, the gather route costs ``M*K*(2*O + MOVE_FLOPS) + CALL_FLOPS`` and the dense one
``P*K*2*O'``. The dense route is one ``conv2d`` and a fill, close to the plain convolution's time on every
map, so it is the safe side: :func:`dense_is_cheaper` takes the gather route only where it wins with its
moves counted :data:`GATHER_MARGIN` times, forward and backward alike (the backward does twice the flops
and moves the values twice). The margin covers the least certain term: flops run near the matmul rate
on any core, a gather of scattered windows at a fraction of the copy bandwidth that varies from machine
to machine. On large maps this reads "dense when the masked fraction M/P is at least
``2*O' / (2*O + GATHER_MARGIN*MOVE_FLOPS)``": in float32 with O = 256 output channels from 80% on, with 80
from 56%, with 4 from 24%; on small maps with few output channels the fixed cost tips it to dense. Both
routes give the same values within the accumulating-op tolerance, and exact zeros off the points.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

# A value moved to memory and back costs a CPU core about the time of 64 flops of a matmul (tens of
# GFLOP/s against a few GB/s of gathered copies), on AMD and Intel cores alike.
MOVE_FLOPS = 64
# How many times the gather route's moves are counted when it is weighed against the dense route (see the
# module docstring): it is taken only where it wins by a clear margin on its least certain term.
GATHER_MARGIN = 2
# The gather route's fixed cost beyond the dense route's: a few more calls (the gather's plan and kernel,
# the product, the copy into the map; about 0.1 ms), counted as the flops of that time on one core.
CALL_FLOPS = 2**23
# The dense convolution's vector of output channels: 64 bytes (AVX-512; 16 float32, 8 float64). With fewer
# output channels it takes as long as with a full vector of them (AVX2 cores: half that, so the rule
# overrates the dense work there by at most 2x below 16 float32 channels).
VECTOR_BYTES = 64


def dense_is_cheaper(points: int, positions: int, weight: Tensor) -> bool:
    """Whether the dense route's work (``positions`` output positions) is no more than the gather
    route's (``points`` gathered windows) with its moves counted :data:`GATHER_MARGIN` times, as in the
    module docstring."""
    out_channels, window = weight.shape[0], weight[0].numel()
    vector = max(out_channels, VECTOR_BYTES // weight.element_size())
    gather = points * window * (2 * out_channels + GATHER_MARGIN * MOVE_FLOPS) + CALL_FLOPS
    return positions * window * 2 * vector <= gather


def needs_op(features: Tensor) -> bool:
    """Whether the gather runs as the custom op: for the gradient of ``features``, or under torch.compile
    (whose tracing needs the op's fake). Otherwise the kernel is called as a plain function."""
    return (torch.is_grad_enabled() and features.requires_grad) or torch.compiler.is_compiling()


def output_keep(mask: Tensor, out_h: int, out_w: int) -> Tensor:
    """The ``[out_h, out_w]`` bool map of the output points to compute: ``mask > 0`` where the output
    overlaps the mask, off beyond it (an output larger or smaller than the mask: other paddings)."""
    if mask.shape[1] == out_h and mask.shape[2] == out_w:
        return mask[0] > 0
    keep = torch.zeros((out_h, out_w), dtype=torch.bool, device=mask.device)
    rows, cols = min(out_h, mask.shape[1]), min(out_w, mask.shape[2])
    keep[:rows, :cols] = mask[0, :rows, :cols] > 0
    return keep


def takes_dense(features: Tensor, weight: Tensor, points: int, keep: Tensor, backend: Optional[str]) -> bool:
    """Whether this call takes the dense route: a CPU float32/float64 call with the default or cpu
    backend, outside torch.compile (the point count is data-dependent there), where the rule says so.
    Where the weight's gradient is wanted every feature value must also be finite: the dense weight
    gradient sums over every position, and a zero gradient times an inf away from the points is NaN."""
    if (features.device.type != "cpu" or backend not in (None, "cpu") or torch.compiler.is_compiling()
            or features.dtype not in (torch.float32, torch.float64)
            or not dense_is_cheaper(points, keep.numel(), weight)):
        return False
    return not (torch.is_grad_enabled() and weight.requires_grad) or bool(torch.isfinite(features).all())


def dense(features: Tensor, keep: Tensor, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """The dense route: ``conv2d`` everywhere, then zeros off ``keep`` (a fill, so that a NaN there does
    not leak; its backward zeroes the gradient there before the convolution's backward)."""
    return F.conv2d(features, weight, bias, padding=padding).masked_fill_(keep.logical_not(), 0)


def product(weight_2d: Tensor, data_col: Tensor, bias: Optional[Tensor]) -> Tensor:
    """``bias[:, None] + weight_2d @ data_col`` (mmcv's addmm): ``[O, K] x [K, M] -> [O, M]``. The larger
    of O and M runs along the rows of the stored product: BLAS runs a product a few columns wide at a
    fraction of its rate. With fewer points than output channels the points are the rows (a
    transposed view is returned), on a contiguous copy of the columns (smaller than the weight), so
    that autograd forms the columns' gradient in that layout too."""
    if torch.compiler.is_compiling():
        # the data-dependent M: aten's mm/addmm backward guards on its strides under torch.compile, einsum's not
        out = torch.einsum("ok,km->om", weight_2d, data_col)
        return out if bias is None else out + bias[:, None]
    if data_col.shape[1] < weight_2d.shape[0]:
        return F.linear(data_col.t().contiguous(), weight_2d, bias).t()
    return weight_2d.mm(data_col) if bias is None else torch.addmm(bias[:, None], weight_2d, data_col)
