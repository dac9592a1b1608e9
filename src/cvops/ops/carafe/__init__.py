"""CARAFE: content-aware reassembly of features (mmcv ``carafe``; MLU-OPS ``carafe_forward`` /
``carafe_backward``).

``y[n, c, oy, ox] = sum_{ky, kx} x[n, c, oy//s + ky - r, ox//s + kx - r] * mask[n, (g*k + ky)*k + kx, oy, ox]``
with ``g = c // (C / G)``, ``r = (k - 1) // 2`` and zero outside the feature map. The mask is used as
given (``CARAFEPack`` normalises it). The backward gathers, so it is deterministic.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..._core.autocast import mixed_to_float32
from ..._core.dispatch import backend_module, check_backend
from ..._core.layout import as_nchw, from_nchw, parse_layout, stored_shape
from ..._core.opdef import custom_op
from . import checks

__all__ = ["carafe", "carafe_forward", "carafe_backward", "carafe_naive"]


def _forward(features: torch.Tensor, masks: torch.Tensor, kernel_size: int, group_size: int, scale_factor: int,
             layout: str, backend: Optional[str]) -> torch.Tensor:
    f, m = as_nchw(features, layout), as_nchw(masks, layout)
    impl = backend_module(__package__, checks.OP, backend, features.device, features, masks)
    if checks.is_empty(features, masks):  # carafe_backward.md 1.1: zero elements return at once
        return features.new_zeros(stored_shape(checks.output_shape(f.shape, scale_factor), layout))
    out = impl.forward(f, m, kernel_size, group_size, scale_factor, layout)
    return from_nchw(out, layout).contiguous()


def _forward_fake(features, masks, kernel_size, group_size, scale_factor, layout, backend):
    return features.new_empty(stored_shape(checks.output_shape(as_nchw(features, layout).shape, scale_factor), layout))


def _forward_grad(s, grad_out):
    return _backward_op(grad_out.contiguous(), s.features, s.masks, s.kernel_size, s.group_size, s.scale_factor,
                        s.layout, s.backend)


def _backward(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor, kernel_size: int,
              group_size: int, scale_factor: int, layout: str,
              backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor]:
    go, f, m = as_nchw(grad_output, layout), as_nchw(features, layout), as_nchw(masks, layout)
    impl = backend_module(__package__, checks.OP, backend, features.device, grad_output, features, masks)
    if checks.is_empty(grad_output, features, masks):
        return (torch.zeros_like(features, memory_format=torch.contiguous_format),
                torch.zeros_like(masks, memory_format=torch.contiguous_format))
    gi, gm = impl.backward(go, f, m, kernel_size, group_size, scale_factor, layout)
    return from_nchw(gi, layout).contiguous(), from_nchw(gm, layout).contiguous()


def _backward_fake(grad_output, features, masks, *_):
    return (torch.empty_like(features, memory_format=torch.contiguous_format),
            torch.empty_like(masks, memory_format=torch.contiguous_format))


def _backward_grad(s, grad_grad_input, grad_grad_mask):
    """The backward is linear in grad_output, grad_input is linear in masks and grad_mask in features, so its
    adjoint is made of the two ops: w.r.t. grad_output ``carafe(gg_input, masks) + carafe(features, gg_mask)``,
    w.r.t. features the grad_input of ``carafe_backward(grad_output, ., gg_mask)``, w.r.t. masks the grad_mask of
    ``carafe_backward(grad_output, gg_input, .)``."""
    args = (s.kernel_size, s.group_size, s.scale_factor, s.layout, s.backend)
    want_grad_output, want_features, want_masks = s.needs_input_grad[:3]
    gg_input = grad_grad_input if grad_grad_input is not None else torch.zeros_like(s.features)
    gg_mask = grad_grad_mask if grad_grad_mask is not None else torch.zeros_like(s.masks)
    grad_output = features = masks = None
    if want_grad_output:
        grad_output = _forward_op(gg_input, s.masks, *args) + _forward_op(s.features, gg_mask, *args)
    if want_features:
        features = _backward_op(s.grad_output, s.features, gg_mask, *args)[0]
    if want_masks:
        masks = _backward_op(s.grad_output, gg_input, s.masks, *args)[1]
    return grad_output, features, masks


_forward_op = custom_op("carafe_forward", _forward, _forward_fake, backward=_forward_grad, save=("features", "masks"))
_backward_op = custom_op("carafe_backward", _backward, _backward_fake, backward=_backward_grad,
                         save=("grad_output", "features", "masks"))


def carafe_forward(features: torch.Tensor, masks: torch.Tensor, kernel_size: int, group_size: int,
                   scale_factor: int, layout: str = "NCHW", backend: str | None = None) -> torch.Tensor:
    """CARAFE upsampling (differentiable; :func:`carafe` is the same function).

    Args:
        features: ``[N, C, H, W]`` (``[N, H, W, C]`` for ``layout="NHWC"``), float16/bfloat16/float32/float64.
        masks: ``[N, G*k*k, sH, sW]`` (``[N, sH, sW, G*k*k]``), same dtype; channel ``(g*k + ky)*k + kx``.
        kernel_size: reassembly kernel size ``k`` (odd, any size).
        group_size: mask groups ``G``; ``C % G == 0``.
        scale_factor: upsampling ratio ``s >= 1``.
        layout: ``"NCHW"`` or ``"NHWC"``; the output is in the same layout.
        backend: ``None`` (the device's default), ``"reference"``, ``"torch"``, ``"numba"`` or ``"triton"``;
            ``"cpu"`` still means the CPU default.

    Returns:
        ``[N, C, sH, sW]`` (or ``[N, sH, sW, C]``), accumulated in float32 (float64 for float64).
    """
    layout = parse_layout("carafe", layout)
    features, masks = mixed_to_float32(features, masks)
    k, g, s = checks.check_forward(features, masks, kernel_size, group_size, scale_factor, layout)
    check_backend(__package__, checks.OP, backend, features.device, features, masks)
    return _forward_op(features, masks, k, g, s, layout, backend)


carafe = carafe_forward
carafe_naive = carafe_forward  # mmcv's naive and optimised kernels compute the same function


def carafe_backward(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor, kernel_size: int,
                    group_size: int, scale_factor: int, layout: str = "NCHW",
                    backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`carafe`: returns ``(grad_input, grad_mask)`` shaped like features and masks.

    ``grad_output`` is ``[N, C, sH, sW]`` (``[N, sH, sW, C]`` for NHWC). Deterministic: every
    gradient element is one gather-sum in a fixed order (no atomics). ``backend``: as in :func:`carafe`.
    """
    layout = parse_layout("carafe", layout)
    grad_output, features, masks = mixed_to_float32(grad_output, features, masks)
    k, g, s = checks.check_backward(grad_output, features, masks, kernel_size, group_size, scale_factor, layout)
    check_backend(__package__, checks.OP, backend, features.device, grad_output, features, masks)
    return _backward_op(grad_output, features, masks, k, g, s, layout, backend)
