"""masked_im2col / masked_col2im (mmcv ``masked_conv2d``; MLU-OPS ``mluOpMaskedIm2colForward``).

``masked_im2col`` gathers the ``kh x kw`` window around each mask point into a column,
``masked_col2im`` scatters one column per mask point back into a feature map. Each is the other's
autograd adjoint; ``masked_conv2d`` (and :class:`cvops.nn.MaskedConv2d`) chains them with a matmul,
or, on the CPU where that costs more, runs the dense convolution and keeps the mask points
(:func:`_dense_keep`: the same values within the accumulating-op tolerance).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..._core.autocast import to_autocast_dtype
from ..._core.dispatch import backend_module, check_backend
from ..._core.opdef import custom_op
from ..._core.validate import pair, require
from . import checks

__all__ = ["masked_im2col", "masked_col2im", "masked_conv2d"]

_OP = "masked_im2col"


def _backend(backend: Optional[str], device: torch.device):
    return backend_module(__package__, _OP, backend, device)


# ---------------------------------------------------------------------------------------------
# The custom ops: each forward's backward is the other op, so gradients of any order flow.

def _im2col(feature: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, kernel_h: int, kernel_w: int, pad_h: int,
            pad_w: int, backend: Optional[str] = None) -> Tensor:
    return _backend(backend, feature.device).im2col_forward(feature, mask_h_idx, mask_w_idx,
                                                            kernel_h, kernel_w, pad_h, pad_w)


def _im2col_fake(feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w, backend=None):
    return feature.new_empty((feature.shape[1] * kernel_h * kernel_w, mask_h_idx.shape[0]))


def _im2col_grad(s, grad_col):
    _, channels, height, width = s.feature
    return _im2col_backward_op(grad_col.contiguous(), s.mask_h_idx, s.mask_w_idx, channels, height, width,
                               s.kernel_h, s.kernel_w, s.pad_h, s.pad_w, s.backend)


def _im2col_backward(grad_col: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, channels: int, height: int,
                     width: int, kernel_h: int, kernel_w: int, pad_h: int, pad_w: int,
                     backend: Optional[str] = None) -> Tensor:
    return _backend(backend, grad_col.device).im2col_backward(
        grad_col, mask_h_idx, mask_w_idx, channels, height, width, kernel_h, kernel_w, pad_h, pad_w)


def _im2col_backward_fake(grad_col, mask_h_idx, mask_w_idx, channels, height, width, *_):
    return grad_col.new_empty((1, channels, height, width))


def _im2col_backward_grad(s, grad_feature):
    return _im2col_op(grad_feature.contiguous(), s.mask_h_idx, s.mask_w_idx, s.kernel_h, s.kernel_w, s.pad_h,
                      s.pad_w, s.backend)


def _col2im(masked_output: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, height: int, width: int,
            backend: Optional[str] = None) -> Tensor:
    return _backend(backend, masked_output.device).col2im_forward(masked_output, mask_h_idx, mask_w_idx,
                                                                  height, width)


def _col2im_fake(masked_output, mask_h_idx, mask_w_idx, height, width, backend=None):
    return masked_output.new_empty((1, masked_output.shape[0], height, width))


def _col2im_grad(s, grad_output):
    return _col2im_backward_op(grad_output.contiguous(), s.mask_h_idx, s.mask_w_idx, s.backend)


def _col2im_backward(grad_output: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor,
                     backend: Optional[str] = None) -> Tensor:
    return _backend(backend, grad_output.device).col2im_backward(grad_output, mask_h_idx, mask_w_idx)


def _col2im_backward_fake(grad_output, mask_h_idx, mask_w_idx, backend=None):
    return grad_output.new_empty((grad_output.shape[1], mask_h_idx.shape[0]))


def _col2im_backward_grad(s, grad_masked):
    _, _, height, width = s.grad_output
    return _col2im_op(grad_masked.contiguous(), s.mask_h_idx, s.mask_w_idx, height, width, s.backend)


_IDX = ("mask_h_idx", "mask_w_idx")  # what every backward keeps
_im2col_op = custom_op("masked_im2col", _im2col, _im2col_fake, backward=_im2col_grad, save=_IDX)
_im2col_backward_op = custom_op("masked_im2col_backward", _im2col_backward, _im2col_backward_fake,
                                backward=_im2col_backward_grad, save=_IDX)
_col2im_op = custom_op("masked_col2im", _col2im, _col2im_fake, backward=_col2im_grad, save=_IDX)
_col2im_backward_op = custom_op("masked_col2im_backward", _col2im_backward, _col2im_backward_fake,
                                backward=_col2im_backward_grad, save=_IDX)


# ---------------------------------------------------------------------------------------------
# Functional API

def masked_im2col(feature: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, kernel_size=3, padding=1, *,
                  backend: Optional[str] = None) -> Tensor:
    """Gather the ``kh x kw`` window at every mask point into a column.

    Args:
        feature: ``[1, C, H, W]`` (NCHW), any floating dtype, not empty.
        mask_h_idx, mask_w_idx: ``[M]`` int32 or int64 row / column of each mask point. Any value
            is legal: window taps outside the feature read 0.
        kernel_size: ``kh`` or ``(kh, kw)``, each >= 1.
        padding: ``pad`` or ``(pad_h, pad_w)``; the window of point m starts at
            ``(mask_h_idx[m] - pad_h, mask_w_idx[m] - pad_w)``.
        backend: ``None`` (triton for CUDA, else cpu), ``"reference"``, ``"cpu"`` or ``"triton"``.

    Returns:
        ``data_col [C*kh*kw, M]`` with ``data_col[(c*kh + i)*kw + j, m] =
        feature[0, c, mask_h_idx[m] - pad_h + i, mask_w_idx[m] - pad_w + j]`` (0 outside).
        Bit-exact copies; differentiable w.r.t. ``feature``.
    """
    kernel_h, kernel_w, pad_h, pad_w = checks.check_masked_im2col(feature, mask_h_idx, mask_w_idx,
                                                                   kernel_size, padding)
    check_backend(_OP, backend, feature.device)
    return _im2col_op(feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w, backend)


def masked_col2im(masked_output: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, height: int, width: int, *,
                  backend: Optional[str] = None) -> Tensor:
    """Scatter one column per mask point back into a zero feature map (mmcv ``masked_col2im_forward``).

    Args:
        masked_output: ``[C, M]``, any floating dtype.
        mask_h_idx, mask_w_idx: ``[M]`` int32 or int64 positions.
        height, width: output spatial size (>= 0).

    Returns:
        ``output [1, C, height, width]``: ``output[0, :, mask_h_idx[m], mask_w_idx[m]] =
        masked_output[:, m]``, zeros elsewhere. Points outside ``height x width`` are dropped, and
        where several points share a position the last one (largest m) is written, on every
        device. Differentiable w.r.t. ``masked_output``.
    """
    height, width = checks.check_masked_col2im(masked_output, mask_h_idx, mask_w_idx, height, width)
    check_backend(_OP, backend, masked_output.device)
    return _col2im_op(masked_output, mask_h_idx, mask_w_idx, height, width, backend)


def masked_conv2d(features: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor] = None, padding=0,
                  stride=1, dilation=1, groups=1, *, backend: Optional[str] = None) -> Tensor:
    """Convolution evaluated only at the mask points (mmcv ``masked_conv2d``), with a backward.

    Args:
        features: ``[1, C, H, W]``.
        mask: ``[1, H, W]``; positions with ``mask > 0`` are computed.
        weight: ``[O, C, kh, kw]``; bias: ``[O]`` or None.
        padding: int or pair. stride, dilation and groups must be 1 (mmcv raises for stride too).

    Returns:
        ``[1, O, H + 2*pad_h - kh + 1, W + 2*pad_w - kw + 1]``: ``bias + W * window`` at each mask
        point, exact zeros elsewhere (no bias there, as in mmcv).
    """
    op = "masked_conv2d"
    features, weight, bias = to_autocast_dtype(features, weight, bias)  # autocast: computes like torch.conv2d
    stride, dilation = pair(op, "stride", stride), pair(op, "dilation", dilation)
    pad_h, pad_w = pair(op, "padding", padding, min_value=0)  # torch's conv rejects negative padding too
    checks.check_masked_conv2d(op, features, mask, weight, bias, stride, dilation, groups)
    out_channels, _, kernel_h, kernel_w = weight.shape
    out_h = features.shape[2] + 2 * pad_h - kernel_h + 1
    out_w = features.shape[3] + 2 * pad_w - kernel_w + 1
    require(out_h > 0 and out_w > 0, op,
            f"output size ({out_h}, {out_w}) must be positive: kernel {kernel_h}x{kernel_w} is larger than the "
            f"padded input {features.shape[2] + 2 * pad_h}x{features.shape[3] + 2 * pad_w}")
    keep = _dense_keep(features, mask, weight, bias, out_h, out_w, backend)
    if keep is not None:
        return _dense_then_select(features, keep, weight, bias, (pad_h, pad_w), out_h, out_w)
    mask_h_idx, mask_w_idx = torch.nonzero(mask[0] > 0, as_tuple=True)  # row-major: sorted by (h, w)
    data_col = masked_im2col(features, mask_h_idx, mask_w_idx, (kernel_h, kernel_w), (pad_h, pad_w),
                             backend=backend)
    masked_out = _project(weight.reshape(out_channels, -1), data_col, bias)
    return masked_col2im(masked_out, mask_h_idx, mask_w_idx, out_h, out_w, backend=backend)


# Cost model of the two CPU routes of masked_conv2d, in nanoseconds, fitted to single-thread CPU times of
# the GA-RetinaNet head (P3..P7 of an 800x1333 image, 256 -> 80 and 256 -> 4 channels, 3x3, 10% and 30%
# masked). A window element is one of the C*kh*kw values of a point's (or position's) window.
_MASKED_FIXED_NS = 250_000   # nonzero, two custom-op calls, the kernel launches
_MASKED_ELEMENT_NS = 1.0     # per window element: gather into data_col, read it back in the product
_MASKED_MAC_NS = 0.017       # per multiply-add of the [O, C*kh*kw] x [C*kh*kw, M] product
_DENSE_ELEMENT_NS = 0.4      # per window element of every output position (conv2d's own packing)
_DENSE_MAC_NS = 0.014        # per multiply-add of the dense convolution


def _needs_grad(*tensors: Optional[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _dense_keep(features: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], out_h: int, out_w: int,
                backend: Optional[str]) -> Optional[Tensor]:
    """The ``[out_h, out_w]`` mask points when the dense convolution (then selecting those points)
    costs less than gathering their windows and multiplying; None selects the masked route.

    The masked route pays per mask point, the dense one per output position; per window element
    the dense route is cheaper (a blocked convolution), so it wins once enough of the map is masked
    (about a quarter for 4 output channels, about two thirds for 80) and on small maps, where the
    masked route's fixed cost dominates. Inference only (the weight gradient of the dense route would
    sum over every position, so a non-finite feature value off the mask points would reach it), CPU
    float32/float64 with the default or cpu backend, and not while torch.compile traces (the count
    is data-dependent)."""
    if (backend not in (None, "cpu") or features.device.type != "cpu"
            or features.dtype not in (torch.float32, torch.float64) or torch.compiler.is_compiling()
            or _needs_grad(features, weight, bias)):
        return None
    out_channels, _, kernel_h, kernel_w = weight.shape
    window = features.shape[1] * kernel_h * kernel_w
    keep = mask[0, :out_h, :out_w] > 0
    points = int(keep.sum())
    masked = _MASKED_FIXED_NS + points * window * (_MASKED_ELEMENT_NS + out_channels * _MASKED_MAC_NS)
    dense = out_h * out_w * window * (_DENSE_ELEMENT_NS + out_channels * _DENSE_MAC_NS)
    return keep if dense < masked else None


def _dense_then_select(features: Tensor, keep: Tensor, weight: Tensor, bias: Optional[Tensor], padding,
                       out_h: int, out_w: int) -> Tensor:
    """``conv2d`` everywhere, then the value at every point of ``keep`` and an exact zero elsewhere (a
    fill, not a product, so a NaN or inf off the mask points does not leak into the zeros)."""
    dense = torch.nn.functional.conv2d(features, weight, bias, padding=padding)
    if keep.shape != (out_h, out_w):  # an output larger than the mask: positions beyond it are off
        full = torch.zeros((out_h, out_w), dtype=torch.bool, device=keep.device)
        full[:keep.shape[0], :keep.shape[1]] = keep
        keep = full
    return dense.masked_fill_(~keep, 0)


def _onednn_matmul_usable(weight_2d: Tensor, data_col: Tensor, bias: Optional[Tensor]) -> bool:
    """oneDNN's fp32 matmul outruns the BLAS one on CPUs where MKL takes its generic path (AMD); it has
    no autograd formula, so it serves inference only."""
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (weight_2d, data_col, bias))
    return (not needs_grad and data_col.device.type == "cpu" and data_col.dtype == torch.float32
            and weight_2d.dtype == torch.float32 and data_col.shape[1] > 0 and weight_2d.shape[0] > 0
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _project(weight_2d: Tensor, data_col: Tensor, bias: Optional[Tensor]) -> Tensor:
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

