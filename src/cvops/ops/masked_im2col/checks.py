"""Parameter checks of masked_im2col / masked_col2im (design doc 1.4 and 3.7, semantics.md §2).

The functional API accepts what mmcv and MLU-OPS accept together: any floating feature dtype,
int32 (MLU-OPS) or int64 (mmcv) mask indices, any index value (out-of-range taps read 0) and any
padding (MLU-OPS does not check it either). The MLU-OPS-only rules (float/half, int32 indices,
descriptor shapes) live in :mod:`cvops.mluops`.
"""
from __future__ import annotations

import torch

from ..._core.validate import (FLOAT_DTYPES, INDEX_DTYPES, check_int, check_same_device, check_tensor, pair,
                               require)

IM2COL = "masked_im2col"
COL2IM = "masked_col2im"
INT64_LIMIT = 2**63


def check_mask_indices(op: str, mask_h_idx, mask_w_idx) -> int:
    """Both index tensors are 1-D int32/int64 of one length; returns that length M."""
    check_tensor(op, "mask_h_idx", mask_h_idx, dim=1, dtypes=INDEX_DTYPES)
    check_tensor(op, "mask_w_idx", mask_w_idx, dim=1, dtypes=INDEX_DTYPES)
    require(mask_h_idx.shape[0] == mask_w_idx.shape[0], op,
            f"mask_h_idx and mask_w_idx must have one length, got {mask_h_idx.shape[0]} and {mask_w_idx.shape[0]}")
    return mask_h_idx.shape[0]  # no int(): a data-dependent size under torch.export stays symbolic


def check_masked_im2col(feature, mask_h_idx, mask_w_idx, kernel_size, padding) -> tuple[int, int, int, int]:
    """Validate the forward; returns ``(kernel_h, kernel_w, pad_h, pad_w)``.

    feature ``[1, C, H, W]`` with at least one element (the doc: an empty feature is BAD_PARAM);
    ``kernel_size >= 1``; ``padding`` any int (negative allowed, as in MLU-OPS) with
    ``|pad_h| + kernel_h + H < 2**63`` (and the same for w). Window coordinates
    ``index - pad + tap`` are int64 on every fast path; under that bound no index value, however
    extreme, wraps into the feature, so every accepted call matches the exact (Python-int)
    reference without scanning the indices.
    """
    check_tensor(IM2COL, "feature", feature, dim=4, dtypes=FLOAT_DTYPES)
    require(feature.shape[0] == 1, IM2COL, f"feature batch (dim 0) must be 1, got {feature.shape[0]}")
    require(feature.numel() > 0, IM2COL,
            f"feature must not be empty (zero-element feature is BAD_PARAM), got shape {tuple(feature.shape)}")
    check_mask_indices(IM2COL, mask_h_idx, mask_w_idx)
    check_same_device(IM2COL, feature=feature, mask_h_idx=mask_h_idx, mask_w_idx=mask_w_idx)
    kernel_h, kernel_w = pair(IM2COL, "kernel_size", kernel_size, min_value=1)
    pad_h, pad_w = pair(IM2COL, "padding", padding)
    for axis, pad, kernel, size in (("h", pad_h, kernel_h, feature.shape[2]), ("w", pad_w, kernel_w, feature.shape[3])):
        if abs(pad) + kernel + size >= INT64_LIMIT:
            require(False, IM2COL, f"padding (pad_{axis}={pad}) too large: |pad_{axis}| + kernel_{axis} + "
                    f"feature size ({abs(pad)} + {kernel} + {size}) must be < 2**63 (int64 window coordinates)")
    return kernel_h, kernel_w, pad_h, pad_w


def check_masked_col2im(masked_output, mask_h_idx, mask_w_idx, height, width) -> tuple[int, int]:
    """Validate the scatter back: ``masked_output [C, M]``, indices ``[M]``; returns ``(height, width)``."""
    check_tensor(COL2IM, "masked_output", masked_output, dim=2, dtypes=FLOAT_DTYPES)
    m = check_mask_indices(COL2IM, mask_h_idx, mask_w_idx)
    require(masked_output.shape[1] == m, COL2IM,
            f"masked_output dim 1 ({masked_output.shape[1]}) must equal the number of mask points ({m})")
    check_same_device(COL2IM, masked_output=masked_output, mask_h_idx=mask_h_idx, mask_w_idx=mask_w_idx)
    height = check_int(COL2IM, "height", height, min_value=0)
    width = check_int(COL2IM, "width", width, min_value=0)
    return height, width


_MASK_DTYPES = FLOAT_DTYPES + INDEX_DTYPES + (torch.bool, torch.uint8, torch.int8, torch.int16)


def check_masked_conv2d(op: str, input, mask, weight, bias, stride, dilation, groups) -> None:
    """MaskedConv2d with a mask: mmcv's asserts as errors, plus what mmcv silently ignores. Every
    tensor's type, rank and size is checked before any of them is used. Messages are built only on
    failure: these checks run on every call, and formatting them all is a sizeable part of a small
    feature map's call."""
    check_tensor(op, "input", input, dim=4, dtypes=FLOAT_DTYPES)
    if input.shape[0] != 1:
        require(False, op, f"input batch (dim 0) must be 1 when a mask is given, got {input.shape[0]}")
    check_tensor(op, "weight", weight, dim=4, dtypes=FLOAT_DTYPES)
    if weight.shape[0] < 1:
        require(False, op, f"weight out_channels (dim 0) must be >= 1, got {weight.shape[0]}")
    if weight.shape[2] < 1 or weight.shape[3] < 1:
        require(False, op, f"weight kernel size (dims 2, 3) must be >= 1, got {tuple(weight.shape[2:])}")
    if bias is not None:
        check_tensor(op, "bias", bias, dim=1)
        if bias.shape[0] != weight.shape[0]:
            require(False, op, f"bias must have out_channels ({weight.shape[0]}) elements, got {bias.shape[0]}")
    check_tensor(op, "mask", mask, dim=3, dtypes=_MASK_DTYPES)
    groups = check_int(op, "groups", groups)
    if mask.shape[0] != 1:
        require(False, op, f"mask batch (dim 0) must be 1, got {mask.shape[0]}")
    if mask.shape[1:] != input.shape[2:]:
        require(False, op, f"mask spatial size {tuple(mask.shape[1:])} must equal input's {tuple(input.shape[2:])}")
    # stride != 1 is a ValueError in mmcv too ("Stride could not only be 1 ...")
    if tuple(stride) != (1, 1):
        require(False, op, f"stride must be 1 when a mask is given, got {tuple(stride)}")
    if tuple(dilation) != (1, 1):
        require(False, op, f"dilation must be 1 when a mask is given, got {tuple(dilation)}")
    if groups != 1:
        require(False, op, f"groups must be 1 when a mask is given, got {groups}")
    if input.shape[1] != weight.shape[1]:
        require(False, op, f"input channels ({input.shape[1]}) must equal weight in_channels ({weight.shape[1]})")
    if input.dtype != weight.dtype:
        require(False, op, f"input dtype {input.dtype} must equal weight dtype {weight.dtype}")
    if bias is not None and bias.dtype != weight.dtype:
        require(False, op, f"bias dtype {bias.dtype} must equal weight dtype {weight.dtype}")
    check_same_device(op, input=input, mask=mask, weight=weight, **({} if bias is None else {"bias": bias}))
