"""masked_im2col / masked_col2im (mmcv ``masked_conv2d``; MLU-OPS ``mluOpMaskedIm2colForward``).

``masked_im2col`` gathers the ``kh x kw`` window around each mask point into a column, ``masked_col2im``
scatters one column per mask point back into a feature map; each is the other's autograd adjoint.
``masked_conv2d`` (and :class:`cvops.nn.MaskedConv2d`) computes from those columns, or on the CPU by the
route of least work (:mod:`.route`).
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from ..._core.autocast import to_autocast_dtype
from ..._core.dispatch import backend_module, check_backend
from ..._core.opdef import custom_op
from ..._core.validate import pair, require
from . import checks, route

__all__ = ["masked_im2col", "masked_col2im", "masked_conv2d"]

_OP = "masked_im2col"


def _backend(backend: Optional[str], values: Tensor, *indices: Tensor):
    return backend_module(__package__, _OP, backend, values.device, values, *indices)


# ---------------------------------------------------------------------------------------------
# The custom ops: each forward's backward is the other op, so gradients of any order flow.

def _im2col(feature: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, kernel_h: int, kernel_w: int, pad_h: int,
            pad_w: int, backend: Optional[str] = None) -> Tensor:
    return _backend(backend, feature, mask_h_idx, mask_w_idx).im2col_forward(
        feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w)


def _im2col_fake(feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w, backend=None):
    return feature.new_empty((feature.shape[1] * kernel_h * kernel_w, mask_h_idx.shape[0]))


def _im2col_grad(s, grad_col):
    _, channels, height, width = s.feature
    return _im2col_backward_op(grad_col.contiguous(), s.mask_h_idx, s.mask_w_idx, channels, height, width,
                               s.kernel_h, s.kernel_w, s.pad_h, s.pad_w, s.backend)


def _im2col_backward(grad_col: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, channels: int, height: int,
                     width: int, kernel_h: int, kernel_w: int, pad_h: int, pad_w: int,
                     backend: Optional[str] = None) -> Tensor:
    return _backend(backend, grad_col, mask_h_idx, mask_w_idx).im2col_backward(
        grad_col, mask_h_idx, mask_w_idx, channels, height, width, kernel_h, kernel_w, pad_h, pad_w)


def _im2col_backward_fake(grad_col, mask_h_idx, mask_w_idx, channels, height, width, *_):
    return grad_col.new_empty((1, channels, height, width))


def _im2col_backward_grad(s, grad_feature):
    return _im2col_op(grad_feature.contiguous(), s.mask_h_idx, s.mask_w_idx, s.kernel_h, s.kernel_w, s.pad_h,
                      s.pad_w, s.backend)


def _col2im(masked_output: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, height: int, width: int,
            backend: Optional[str] = None) -> Tensor:
    return _backend(backend, masked_output, mask_h_idx, mask_w_idx).col2im_forward(
        masked_output, mask_h_idx, mask_w_idx, height, width)


def _col2im_fake(masked_output, mask_h_idx, mask_w_idx, height, width, backend=None):
    return masked_output.new_empty((1, masked_output.shape[0], height, width))


def _col2im_grad(s, grad_output):
    return _col2im_backward_op(grad_output.contiguous(), s.mask_h_idx, s.mask_w_idx, s.backend)


def _col2im_backward(grad_output: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor,
                     backend: Optional[str] = None) -> Tensor:
    return _backend(backend, grad_output, mask_h_idx, mask_w_idx).col2im_backward(
        grad_output, mask_h_idx, mask_w_idx)


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
        backend: ``None`` (the device's default), ``"reference"``, ``"torch"``, ``"numba"`` or
            ``"triton"``; ``"cpu"`` still means the CPU default.

    Returns:
        ``data_col [C*kh*kw, M]`` with ``data_col[(c*kh + i)*kw + j, m] =
        feature[0, c, mask_h_idx[m] - pad_h + i, mask_w_idx[m] - pad_w + j]`` (0 outside).
        Bit-exact copies; differentiable w.r.t. ``feature``. On the CPU the call needs ``data_col``
        and less than 8 MiB of scratch besides its inputs.
    """
    kernel_h, kernel_w, pad_h, pad_w = checks.check_masked_im2col(feature, mask_h_idx, mask_w_idx,
                                                                   kernel_size, padding)
    check_backend(__package__, _OP, backend, feature.device, feature, mask_h_idx, mask_w_idx)
    return _im2col_op(feature, mask_h_idx, mask_w_idx, kernel_h, kernel_w, pad_h, pad_w, backend)


def masked_col2im(masked_output: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, height: int, width: int, *,
                  backend: Optional[str] = None) -> Tensor:
    """Scatter one column per mask point back into a zero feature map (mmcv ``masked_col2im_forward``).

    Args:
        masked_output: ``[C, M]``, any floating dtype.
        mask_h_idx, mask_w_idx: ``[M]`` int32 or int64 positions.
        height, width: output spatial size (>= 0).
        backend: as in :func:`masked_im2col`.

    Returns:
        ``output [1, C, height, width]``: ``output[0, :, mask_h_idx[m], mask_w_idx[m]] =
        masked_output[:, m]``, zeros elsewhere. Points outside ``height x width`` are dropped, and
        where several points share a position the last one (largest m) is written, on every
        device. Differentiable w.r.t. ``masked_output``. On the CPU the call needs ``output`` and less
        than 8 MiB of scratch besides its inputs.
    """
    height, width = checks.check_masked_col2im(masked_output, mask_h_idx, mask_w_idx, height, width)
    check_backend(__package__, _OP, backend, masked_output.device, masked_output, mask_h_idx,
                  mask_w_idx)
    return _col2im_op(masked_output, mask_h_idx, mask_w_idx, height, width, backend)


def _int_pair(op: str, name: str, value, min_value: Optional[int] = None) -> tuple[int, int]:
    """:func:`pair` with the plain-int and two-int-list cases first (every ``MaskedConv2d`` call passes
    lists of ints): the same result, without the general checks."""
    kind = type(value)
    if kind is int:
        items = (value, value)
    elif (kind is list or kind is tuple) and len(value) == 2 and type(value[0]) is int and type(value[1]) is int:
        items = (value[0], value[1])
    else:
        return pair(op, name, value, min_value=min_value)
    if min_value is not None and (items[0] < min_value or items[1] < min_value):
        return pair(op, name, value, min_value=min_value)  # raises, naming the argument
    return items


def masked_conv2d(features: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor] = None, padding=0,
                  stride=1, dilation=1, groups=1, *, backend: Optional[str] = None) -> Tensor:
    """Convolution evaluated only at the mask points (mmcv ``masked_conv2d``), with a backward.

    Args:
        features: ``[1, C, H, W]``.
        mask: ``[1, H, W]``; positions with ``mask > 0`` are computed.
        weight: ``[O, C, kh, kw]``; bias: ``[O]`` or None.
        padding: int or pair. stride, dilation and groups must be 1 (mmcv raises for stride too).
        backend: as in :func:`masked_im2col` (``None`` and ``"cpu"`` may take the dense or taps route on the CPU).

    Returns:
        ``[1, O, H + 2*pad_h - kh + 1, W + 2*pad_w - kw + 1]``: ``bias + W * window`` at each mask
        point, exact zeros elsewhere (no bias there, as in mmcv).
    """
    op = "masked_conv2d"
    features, weight, bias = to_autocast_dtype(features, weight, bias)  # autocast: computes like torch.conv2d
    stride, dilation = _int_pair(op, "stride", stride), _int_pair(op, "dilation", dilation)
    pad_h, pad_w = _int_pair(op, "padding", padding, min_value=0)  # torch's conv rejects negative padding too
    checks.check_masked_conv2d(op, features, mask, weight, bias, stride, dilation, groups)
    check_backend(__package__, op, backend, features.device, features)
    out_channels, _, kernel_h, kernel_w = weight.shape
    out_h = features.shape[2] + 2 * pad_h - kernel_h + 1
    out_w = features.shape[3] + 2 * pad_w - kernel_w + 1
    if out_h <= 0 or out_w <= 0:  # the message built only on failure: this runs on every call
        require(False, op, f"output size ({out_h}, {out_w}) must be positive: kernel {kernel_h}x{kernel_w} is larger "
                f"than the padded input {features.shape[2] + 2 * pad_h}x{features.shape[3] + 2 * pad_w}")
    keep = route.output_keep(mask, out_h, out_w)
    which = route.choose(features, weight, keep, (pad_h, pad_w), backend)
    if which != "gather":
        return (route.dense if which == "dense" else route.taps)(features, keep, weight, bias, (pad_h, pad_w))
    points = keep.reshape(-1).nonzero().view(-1)  # flat h*out_w + w, ascending (row-major for a strided mask too)
    if route.in_blocks(features, weight, bias):
        rows, cols = points // out_w, points % out_w
        values = route.blocked_product(weight.reshape(out_channels, -1), bias, points.shape[0], lambda lo, hi: _im2col(
            features, rows[lo:hi], cols[lo:hi], kernel_h, kernel_w, pad_h, pad_w, backend))
    else:
        # the indices are ours (checked); without autograd or torch.compile the kernel runs without the custom
        # op, whose dispatch costs about as much as the whole gather on the small pyramid levels
        gather = _im2col_op if route.needs_op(features) else _im2col
        data_col = gather(features, points // out_w, points % out_w, kernel_h, kernel_w, pad_h, pad_w, backend)
        values = route.product(weight.reshape(out_channels, -1), data_col, bias)
    # the points are distinct and inside the output: one differentiable copy instead of masked_col2im's scatter
    out = values.new_zeros((out_channels, out_h * out_w)).index_copy(1, points, values)
    return out.view(1, out_channels, out_h, out_w)
