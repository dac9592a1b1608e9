"""CARAFE: content-aware reassembly of features (mmcv ``carafe``; MLU-OPS ``carafe_forward`` /
``carafe_backward``).

``y[n, c, oy, ox] = sum_{ky, kx} x[n, c, oy//s + ky - r, ox//s + kx - r] * mask[n, (g*k + ky)*k + kx, oy, ox]``
with ``g = c // (C / G)``, ``r = (k - 1) // 2`` and zero outside the feature map. The mask is used as
given (``CARAFEPack`` normalises it). The backward gathers, so it is deterministic.
"""
from __future__ import annotations

from typing import Optional

import torch

from cvops._core.autocast import mixed_to_float32
from cvops._core.dispatch import backend_module
from cvops._core.layout import as_nchw, from_nchw, parse_layout

from . import checks

__all__ = ["carafe", "carafe_forward", "carafe_backward", "carafe_naive"]


def _stored_shape(shape_nchw, layout: str):
    n, c, h, w = shape_nchw
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def _forward_impl(features, masks, kernel_size, group_size, scale_factor, layout, backend):
    f, m = as_nchw(features, layout), as_nchw(masks, layout)
    shape = checks.output_shape(f.shape, scale_factor)
    impl = backend_module(__package__, "carafe", backend, features.device)
    if checks.is_empty(features, masks):  # carafe_backward.md 1.1: zero elements return at once
        return features.new_zeros(_stored_shape(shape, layout))
    out = impl.forward(f, m, kernel_size, group_size, scale_factor, layout)
    return from_nchw(out, layout).contiguous()


def _backward_impl(grad_output, features, masks, kernel_size, group_size, scale_factor, layout, backend):
    go, f, m = as_nchw(grad_output, layout), as_nchw(features, layout), as_nchw(masks, layout)
    impl = backend_module(__package__, "carafe", backend, features.device)
    if checks.is_empty(grad_output, features, masks):
        return (torch.zeros_like(features, memory_format=torch.contiguous_format),
                torch.zeros_like(masks, memory_format=torch.contiguous_format))
    gi, gm = impl.backward(go, f, m, kernel_size, group_size, scale_factor, layout)
    return from_nchw(gi, layout).contiguous(), from_nchw(gm, layout).contiguous()


@torch.library.custom_op("cvops::carafe_forward", mutates_args=())
def _carafe_forward_op(features: torch.Tensor, masks: torch.Tensor, kernel_size: int, group_size: int,
                       scale_factor: int, layout: str, backend: Optional[str]) -> torch.Tensor:
    return _forward_impl(features, masks, kernel_size, group_size, scale_factor, layout, backend)


@_carafe_forward_op.register_fake
def _(features, masks, kernel_size, group_size, scale_factor, layout, backend):
    shape = checks.output_shape(as_nchw(features, layout).shape, scale_factor)
    return features.new_empty(_stored_shape(shape, layout))


@torch.library.custom_op("cvops::carafe_backward", mutates_args=())
def _carafe_backward_op(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor,
                        kernel_size: int, group_size: int, scale_factor: int, layout: str,
                        backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor]:
    return _backward_impl(grad_output, features, masks, kernel_size, group_size, scale_factor, layout, backend)


@_carafe_backward_op.register_fake
def _(grad_output, features, masks, kernel_size, group_size, scale_factor, layout, backend):
    return torch.empty_like(features, memory_format=torch.contiguous_format), \
        torch.empty_like(masks, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    features, masks, kernel_size, group_size, scale_factor, layout, backend = inputs
    ctx.save_for_backward(features, masks)
    ctx.params = (kernel_size, group_size, scale_factor, layout, backend)


def _backward(ctx, grad_out):
    features, masks = ctx.saved_tensors
    kernel_size, group_size, scale_factor, layout, backend = ctx.params
    grad_input, grad_mask = _carafe_backward_op(grad_out.contiguous(), features, masks, kernel_size,
                                                group_size, scale_factor, layout, backend)
    return grad_input, grad_mask, None, None, None, None, None


_carafe_forward_op.register_autograd(_backward, setup_context=_setup_context)


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
        backend: ``None`` (triton for CUDA, cpu otherwise), ``"cpu"``, ``"triton"`` or ``"reference"``.

    Returns:
        ``[N, C, sH, sW]`` (or ``[N, sH, sW, C]``), accumulated in float32 (float64 for float64).
    """
    layout = parse_layout("carafe", layout)
    features, masks = mixed_to_float32(features, masks)
    k, g, s = checks.check_forward(features, masks, kernel_size, group_size, scale_factor,
                                   as_nchw(features, layout) if isinstance(features, torch.Tensor) and features.dim() == 4 else None,
                                   as_nchw(masks, layout) if isinstance(masks, torch.Tensor) and masks.dim() == 4 else None)
    return _carafe_forward_op(features, masks, k, g, s, layout, backend)


carafe = carafe_forward
carafe_naive = carafe_forward  # mmcv's naive and optimised kernels compute the same function


def carafe_backward(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor, kernel_size: int,
                    group_size: int, scale_factor: int, layout: str = "NCHW",
                    backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`carafe`: returns ``(grad_input, grad_mask)`` shaped like features and masks.

    ``grad_output`` is ``[N, C, sH, sW]`` (``[N, sH, sW, C]`` for NHWC). Deterministic: every
    gradient element is one gather-sum in a fixed order (no atomics).
    """
    layout = parse_layout("carafe", layout)
    grad_output, features, masks = mixed_to_float32(grad_output, features, masks)
    nchw = (lambda t: as_nchw(t, layout) if isinstance(t, torch.Tensor) and t.dim() == 4 else None)
    k, g, s = checks.check_backward(grad_output, features, masks, kernel_size, group_size, scale_factor,
                                    nchw(grad_output), nchw(features), nchw(masks))
    return _carafe_backward_op(grad_output, features, masks, k, g, s, layout, backend)
