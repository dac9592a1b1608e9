"""How ``masked_conv2d`` computes on the CPU: three routes, one rule that counts their work.

* *gather*: ``masked_im2col`` of the M points' windows (K = C*kh*kw values each), one ``[O, K] x [K, M]``
  product, its columns copied into a zero map: 2*O*K*M flops and K*M moved values.
* *dense*: ``conv2d`` over all P = out_h*out_w positions, then zeros off the points: 2*O'*K*P flops, with
  O' = max(O, one vector of output channels: the convolution computes them a vector at a time).
* *taps*: ``Y [kh*kw*O, H*W] = W [kh*kw*O, C] x X [C, H*W]`` (BLAS fills its vectors along H*W, so few
  output channels cost only their share), then each position sums its kh*kw shifted entries of Y (one
  ``fold``) and zeros go off the points: 2*C*kh*kw*O*H*W flops and kh*kw*O*P moved values.

:func:`cheapest` counts a moved value as :data:`MOVE_FLOPS` flops (the gather's :data:`GATHER_MARGIN` times)
plus :data:`CALL_FLOPS` for the gather route, and takes the least work (ties: dense, then taps). All three
give the same values within the accumulating-op tolerance, exact zeros off the points, and a NaN or inf
off the points' windows reaches no output. A CPU call that wants no gradient gathers and multiplies its
points in blocks of a few MiB of columns (:func:`blocked_product`).
"""
from __future__ import annotations

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


def cheapest(points: int, features: Tensor, out_positions: int, weight: Tensor, with_taps: bool = True) -> str:
    """The route of least work (``"dense"``, ``"taps"`` or ``"gather"``; not ``"taps"`` unless ``with_taps``)
    for ``points`` output points of ``out_positions`` on the map of ``features``, as in the module docstring."""
    out_channels, channels, kernel_h, kernel_w = weight.shape
    taps_count = kernel_h * kernel_w
    window = channels * taps_count
    vector = max(out_channels, VECTOR_BYTES // weight.element_size())
    work = {"dense": out_positions * window * 2 * vector,
            "taps": (features.shape[2] * features.shape[3] * window * 2 * out_channels
                     + out_positions * taps_count * out_channels * MOVE_FLOPS),
            "gather": points * window * (2 * out_channels + GATHER_MARGIN * MOVE_FLOPS) + CALL_FLOPS}
    if not with_taps:
        del work["taps"]
    return min(work, key=work.get)  # the first of equals: dense, then taps


def choose(features: Tensor, weight: Tensor, keep: Tensor, padding, backend: Optional[str]) -> str:
    """This call's route: the :func:`cheapest` (taps where :func:`takes_taps`) for a CPU float32/float64 call
    with the default or cpu backend outside torch.compile (the point count is data-dependent there), else the
    gather route.
    Where the weight's gradient is wanted every feature value must also be finite for the dense and taps
    routes: their weight gradient sums over every position, and a zero gradient times an inf away
    from the points is NaN."""
    if (features.device.type != "cpu" or backend not in (None, "cpu") or torch.compiler.is_compiling()
            or features.dtype not in (torch.float32, torch.float64)):
        return "gather"
    which = cheapest(int(keep.count_nonzero()), features, keep.numel(), weight, takes_taps(weight, padding))
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
    """``bias[:, None] + weight_2d @ data_col`` (mmcv's addmm): ``[O, K] x [K, M] -> [O, M]``. BLAS fills its
    vectors along the stored rows and runs a product a few columns wide at a fraction of its rate: with
    fewer points than a vector holds the points are the rows (a transposed view is returned), on a
    contiguous copy of the columns (a small one), so that autograd forms the columns' gradient in that
    layout too. From a vector of points on, the columns stay as they are: transposing them costs more
    (twice with the gradient) than BLAS loses on a product a few vectors wide."""
    if torch.compiler.is_compiling():
        # the data-dependent M: aten's mm/addmm backward guards on its strides under torch.compile, einsum's not
        out = torch.einsum("ok,km->om", weight_2d, data_col)
        return out if bias is None else out + bias[:, None]
    if data_col.shape[1] < VECTOR_BYTES // data_col.element_size():
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


def taps(features: Tensor, keep: Tensor, weight: Tensor, bias: Optional[Tensor], padding) -> Tensor:
    """The taps route's output ``[1, O, out_h, out_w]``, zeros off ``keep``. Each position's sum of its
    window's entries of ``Y`` (module docstring) is a ``fold`` of ``Y`` with the taps reversed: ``fold``
    adds tap ``t`` of position ``p`` into ``p + t - pad'``, so reversed taps and ``pad' = k - 1 - pad`` add
    into each position exactly its window's ``kh*kw`` entries (:func:`takes_taps`: ``pad <= k - 1``)."""
    _, channels, height, width = features.shape
    out_channels, _, kernel_h, kernel_w = weight.shape
    taps_count = kernel_h * kernel_w
    pad_h, pad_w = padding
    # row o*kh*kw + t holds tap kh*kw - 1 - t of output channel o: fold's channel-major, tap-minor rows
    tap_weight = weight.reshape(out_channels, channels, taps_count).flip(2).transpose(1, 2)
    products = tap_weight.reshape(-1, channels).mm(features.reshape(channels, height * width))
    out = F.fold(products.unsqueeze(0), keep.shape[-2:], (kernel_h, kernel_w),
                 padding=(kernel_h - 1 - pad_h, kernel_w - 1 - pad_w))
    if bias is not None:
        out = out + bias.view(1, -1, 1, 1)
    return out.masked_fill_(keep.logical_not(), 0)


def takes_taps(weight: Tensor, padding) -> bool:
    """Whether the taps route computes this geometry: a padding of at most the kernel size - 1 (fold's own
    padding, ``k - 1 - pad``, is not negative), every layer of the detection heads."""
    return padding[0] < weight.shape[2] and padding[1] < weight.shape[3]
