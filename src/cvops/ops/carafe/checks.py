"""Parameter checks of carafe (design doc 3.8 and semantics.md §4), shared by every API level.

The functional API has no MLU on-chip limits (k <= 45, s <= 5 forward; k <= 137 backward): those
are reproduced as NOT_SUPPORTED in :mod:`cvops.mluops` only (decisions.md).
"""
from __future__ import annotations

import torch

from cvops._core.layout import nchw_shape
from cvops._core.validate import FLOAT_DTYPES, check_int, check_same_device, check_tensor, require

OP = "carafe"


def check_params(kernel_size, group_size, scale_factor, op: str = OP) -> tuple[int, int, int]:
    """k >= 1 and odd, G >= 1, s >= 1; returns them as ints."""
    k = check_int(op, "kernel_size", kernel_size, min_value=1)
    require(k % 2 == 1, op, f"kernel_size must be odd (the window is centred), got {k}")
    g = check_int(op, "group_size", group_size, min_value=1)
    s = check_int(op, "scale_factor", scale_factor, min_value=1)
    return k, g, s


def check_shapes(op: str, features_shape, masks_shape, k: int, g: int, s: int) -> None:
    """Logical NCHW shapes: features [N, C, H, W], masks [N, G*k*k, sH, sW]."""
    n, c, h, w = features_shape
    mn, mc, mh, mw = masks_shape
    require(mn == n, op, f"masks batch ({mn}) must equal features batch ({n})")
    require(c % g == 0, op, f"features channels ({c}) must be divisible by group_size ({g})")
    require(mc == g * k * k, op,
            f"masks channels ({mc}) must equal group_size * kernel_size^2 ({g} * {k}^2 = {g * k * k})")
    require(mh == h * s and mw == w * s, op,
            f"masks spatial size ({mh}, {mw}) must equal features size * scale_factor ({h * s}, {w * s})")


def check_forward(features, masks, kernel_size, group_size, scale_factor, layout: str = "NCHW",
                  op: str = OP) -> tuple[int, int, int]:
    """Checks of the forward on tensors stored in ``layout``; returns ``(k, G, s)`` as ints."""
    check_tensor(op, "features", features, dim=4, dtypes=FLOAT_DTYPES)
    check_tensor(op, "masks", masks, dim=4, dtypes=FLOAT_DTYPES)
    require(masks.dtype == features.dtype, op,
            f"masks dtype ({masks.dtype}) must equal features dtype ({features.dtype})")
    check_same_device(op, features=features, masks=masks)
    k, g, s = check_params(kernel_size, group_size, scale_factor, op)
    check_shapes(op, nchw_shape(features.shape, layout), nchw_shape(masks.shape, layout), k, g, s)
    return k, g, s


def check_backward(grad_output, features, masks, kernel_size, group_size, scale_factor, layout: str = "NCHW",
                   op: str = OP) -> tuple[int, int, int]:
    k, g, s = check_forward(features, masks, kernel_size, group_size, scale_factor, layout, op)
    check_tensor(op, "grad_output", grad_output, dim=4, dtypes=FLOAT_DTYPES)
    require(grad_output.dtype == features.dtype, op,
            f"grad_output dtype ({grad_output.dtype}) must equal features dtype ({features.dtype})")
    check_same_device(op, features=features, grad_output=grad_output)
    shape, expected = nchw_shape(grad_output.shape, layout), output_shape(nchw_shape(features.shape, layout), s)
    require(shape == expected, op,
            f"grad_output shape {shape} (as NCHW) must be {expected} (features batch, channels, size * scale)")
    return k, g, s


def output_shape(features_shape, s: int) -> tuple[int, int, int, int]:
    n, c, h, w = features_shape
    return (n, c, h * s, w * s)


def is_empty(*tensors: torch.Tensor) -> bool:
    return any(t.numel() == 0 for t in tensors)
