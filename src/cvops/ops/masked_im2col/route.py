"""How ``masked_conv2d`` computes on the CPU: three routes, one rule that counts their work.

* *gather*: ``masked_im2col`` of the M points' windows (K = C*kh*kw values each), one ``[O, K] x [K, M]``
  product, its columns copied into a zero map: 2*O*K*M flops and K*M moved values.
* *dense*: ``conv2d`` over all P = out_h*out_w positions, then zeros off the points: 2*O'*K*P flops, with
  O' = max(O, one vector of output channels: the convolution computes them a vector at a time).
* *taps*: ``Y [kh*kw*O, H*W] = W [kh*kw*O, C] x X [C, H*W]`` (BLAS fills its vectors along H*W, so few
  output channels cost only their share), then each point sums its kh*kw shifted entries of Y:
  2*C*kh*kw*O*H*W flops and kh*kw*O*M moved values.

:func:`cheapest` counts a moved value as :data:`MOVE_FLOPS` flops (the gather's :data:`GATHER_MARGIN` times)
plus :data:`CALL_FLOPS` for the gather route, and takes the least work (ties: dense, then taps). All three
give the same values within the accumulating-op tolerance, exact zeros off the points, and a NaN or inf
off the points' windows reaches no output. A CPU call that wants no gradient gathers and multiplies its
points in blocks of a few MiB of columns (:func:`blocked_product`).
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._core.memory import block_rows

# A value moved to memory and back costs a core about 64 flops of a matmul (tens of GFLOP/s against a
# few GB/s of gathered copies), on AMD and Intel cores alike.
MOVE_FLOPS = 64
# The gather route's moves count twice: it is taken only where it wins clearly on its least certain term.
GATHER_MARGIN = 2
# The gather route's extra calls (plan, kernel, product, copy into the map: about 0.1 ms) as flops.
CALL_FLOPS = 2**23
# The dense convolution's vector of output channels (AVX-512: 16 float32; AVX2 cores have half, so the
# rule overrates the dense work there by at most 2x below 16 float32 channels).
VECTOR_BYTES = 64


def cheapest(points: int, features: Tensor, out_positions: int, weight: Tensor) -> str:
    """The route of least work (``"dense"``, ``"taps"`` or ``"gather"``) for ``points`` output points of
    ``out_positions`` on the map of ``features``, as in the module docstring."""
    out_channels, channels, kernel_h, kernel_w = weight.shape
    taps_count = kernel_h * kernel_w
    window = channels * taps_count
    vector = max(out_channels, VECTOR_BYTES // weight.element_size())
    work = {"dense": out_positions * window * 2 * vector,
            "taps": (features.shape[2] * features.shape[3] * window * 2 * out_channels
                     + points * taps_count * out_channels * MOVE_FLOPS),
            "gather": points * window * (2 * out_channels + GATHER_MARGIN * MOVE_FLOPS) + CALL_FLOPS}
    return min(work, key=work.get)  # the first of equals: dense, then taps


def choose(features: Tensor, weight: Tensor, keep: Tensor, backend: Optional[str]) -> str:
    """This call's route: the :func:`cheapest` for a CPU float32/float64 call with the default or cpu
    backend outside torch.compile (the point count is data-dependent there), else the gather route.
    Where the weight's gradient is wanted every feature value must also be finite for the dense and taps
    routes: their weight gradient sums over every position, and a zero gradient times an inf away
    from the points is NaN."""
    if (features.device.type != "cpu" or backend not in (None, "cpu") or torch.compiler.is_compiling()
            or features.dtype not in (torch.float32, torch.float64)):
        return "gather"
    which = cheapest(int(keep.count_nonzero()), features, keep.numel(), weight)
    if which != "gather" and torch.is_grad_enabled() and weight.requires_grad:
        # a finite sum means every value is finite (a NaN or an inf makes it NaN or inf); a sum that only
        # overflows sends the call to the gather route, which is right on any input, in one pass, not four
        return which if bool(features.sum().isfinite()) else "gather"
    return which


def needs_op(features: Tensor) -> bool:
    """Whether the gather runs as the custom op: for the gradient of ``features``, or under torch.compile
    (whose tracing needs the op's fake). Otherwise the kernel is called as a plain function."""
    return (torch.is_grad_enabled() and features.requires_grad) or torch.compiler.is_compiling()


def in_blocks(features: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether the gather route runs as :func:`blocked_product`: a CPU call that wants no gradient,
    outside torch.compile."""
    if features.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    return not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in (features, weight, bias))


def output_keep(mask: Tensor, out_h: int, out_w: int) -> Tensor:
    """The ``[out_h, out_w]`` (``[1, out_h, out_w]`` where the sizes match) bool map of the output points
    to compute: ``mask > 0`` where the output overlaps the mask, off beyond it (an output larger or
    smaller than the mask: other paddings)."""
    if mask.shape[1] == out_h and mask.shape[2] == out_w:
        return mask > 0  # [1, out_h, out_w]: the same positions, without an indexing call
    keep = torch.zeros((out_h, out_w), dtype=torch.bool, device=mask.device)
    rows, cols = min(out_h, mask.shape[1]), min(out_w, mask.shape[2])
    keep[:rows, :cols] = mask[0, :rows, :cols] > 0
    return keep


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


def blocked_product(weight_2d: Tensor, bias: Optional[Tensor], count: int,
                    columns: Callable[[int, int], Tensor]) -> Tensor:
    """:func:`product` of the columns of ``count`` points, taken in blocks of points whose columns
    (``columns(lo, hi)``: ``[K, hi - lo]``) fill at most ``_core.memory.BLOCK_BYTES``: a block is still in
    cache when its product reads it, and the call's scratch stays a few MiB (a large map's whole columns
    are tens of MiB of fresh pages on every call). No autograd: for calls that want no gradient.
    Returns ``[O, count]``. Each block's product is stored a point per row, except for fewer output
    channels than a vector holds: BLAS fills its vectors along the stored rows."""
    out_channels, window = weight_2d.shape
    step = block_rows(window * weight_2d.element_size())
    by_point = out_channels >= VECTOR_BYTES // weight_2d.element_size()
    values = weight_2d.new_empty((count, out_channels) if by_point else (out_channels, count))
    for lo in range(0, count, step):
        hi = min(lo + step, count)
        data_col = columns(lo, hi)
        if by_point:
            a, b, out = data_col.t(), weight_2d.t(), values[lo:hi]
        else:
            a, b, out = weight_2d, data_col, values[:, lo:hi]
        if bias is None:
            torch.mm(a, b, out=out)
        else:
            torch.addmm(bias if by_point else bias[:, None], a, b, out=out)
    return values.t() if by_point else values


@functools.lru_cache(maxsize=64)
def _tap_offsets(kernel_h: int, kernel_w: int, padded_w: int) -> Tensor:
    """``[kh*kw, 1, 1]``: tap (i, j)'s flat offset ``i*padded_w + j`` in the padded map (CPU int64; the
    taps route runs on the CPU only). Made once per geometry: a small tensor costs a call as long as
    the tap sum on the smallest maps."""
    return torch.tensor([i * padded_w + j for i in range(kernel_h) for j in range(kernel_w)]).view(-1, 1, 1)


def taps(features: Tensor, points: Tensor, out_w: int, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """The taps route's values at ``points`` (flat ``h*out_w + w``): ``[O, M]``. ``Y`` (see the module
    docstring) is zero-padded like the input, so that a tap outside the map reads 0 and a point's tap
    (i, j) reads Y's padded position ``(h + i, w + j)``."""
    _, channels, height, width = features.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    taps_count = kernel_h * kernel_w
    pad_h, pad_w = padding
    tap_weight = weight.permute(2, 3, 0, 1).reshape(taps_count * out_channels, channels)  # row (i*kw + j)*O + o
    products = tap_weight.mm(features.reshape(channels, height * width))
    if pad_h or pad_w:
        products = F.pad(products.view(-1, height, width), (pad_w, pad_w, pad_h, pad_h))
    padded_w = width + 2 * pad_w
    origin = points + (points // out_w) * (padded_w - out_w)  # (h, w) -> h*padded_w + w
    index = (_tap_offsets(kernel_h, kernel_w, padded_w) + origin).expand(taps_count, out_channels, points.shape[0])
    values = products.view(taps_count, out_channels, -1).gather(2, index).sum(0)
    return values if bias is None else values + bias[:, None]
