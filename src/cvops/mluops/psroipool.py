"""MLU-OPS interface of psroipool: ``mluOpGetPsRoiPoolWorkspaceSize``, ``mluOpPsRoiPoolForward`` and
``mluOpPsRoiPoolBackward`` on NHWC descriptors and caller-allocated outputs."""
from __future__ import annotations

import math

from .descriptor import (DataType, Layout, check_data, check_descriptor, check_workspace, returns_status,
                                workspace_query)
from .._core.errors import Status
from .._core.validate import check_int, require, require_supported
from ..ops.psroipool import psroi_pool as _psroi_pool, psroi_pool_backward as _psroi_pool_backward

__all__ = ["get_psroipool_workspace_size", "psroipool_backward", "psroipool_forward"]


def _psroipool_descriptors(op, named, dtypes):
    """Non-null descriptors; 2^31 elements or bytes is NOT_SUPPORTED (MLU-OPS LARGE_TENSOR_SIZE); then
    dims (4, 2, 4, 4), the given dtypes, and NHWC for every tensor but the rois (second) -- BAD_PARAM."""
    for name, desc in named:
        check_descriptor(op, name, desc)
    for name, desc in named:
        nbytes = desc.numel * desc.itemsize
        require_supported(nbytes < 2**31, op, f"{name} has 2^31 or more bytes")
    for (name, desc), dim in zip(named, (4, 2, 4, 4)):
        require(desc.dim == dim, op, f"{name} must be {dim}-D, got {desc.dim}-D")
    for (name, desc), dtype in zip(named, dtypes):
        require(desc.dtype == dtype, op, f"{name} dtype must be {dtype.name}, got {desc.dtype.name}")
    for name, desc in (named[0], named[2], named[3]):
        require(desc.layout == Layout.NHWC, op, f"{name} layout must be NHWC, got {desc.layout.name}")


def _psroipool_common(op, pooled_height, pooled_width, spatial_scale, output_dim, pooled_desc, rois_desc):
    """The pooled-tensor, scale and rois checks shared by forward (output) and backward (top_grad); all BAD_PARAM."""
    for name, v in (("pooled_height", pooled_height), ("pooled_width", pooled_width), ("output_dim", output_dim)):
        check_int(op, name, v)
    r, ph, pw, od = pooled_desc.shape
    require(pooled_height == ph, op, f"pooled_height ({pooled_height}) must equal the pooled tensor's dim 1 ({ph})")
    require(pooled_width == pw, op, f"pooled_width ({pooled_width}) must equal the pooled tensor's dim 2 ({pw})")
    require(output_dim == od, op, f"output_dim ({output_dim}) must equal the pooled tensor's dim 3 ({od})")
    require(ph == pw, op, f"pooled_height ({ph}) must equal pooled_width ({pw})")
    require(od >= 1, op, f"output_dim must be >= 1, got {od}")
    _check_scale_and_rois(op, spatial_scale, rois_desc, r)
    return r, ph, pw, od


def _check_scale_and_rois(op, spatial_scale, rois_desc, r):
    require(isinstance(spatial_scale, (int, float)) and not isinstance(spatial_scale, bool)
            and math.isfinite(spatial_scale) and spatial_scale > 0, op,
            f"spatial_scale must be a finite number > 0, got {spatial_scale!r}")
    require(rois_desc.shape[1] == 5, op, f"rois must be [R, 5], got {rois_desc.shape}")
    require(rois_desc.shape[0] == r, op, f"rois count ({rois_desc.shape[0]}) must equal the pooled tensor's dim 0 ({r})")


def get_psroipool_workspace_size(handle, output_dim) -> tuple[Status, int]:
    """``mluOpGetPsRoiPoolWorkspaceSize`` -> ``(status, size_in_bytes)``; the size is ``output_dim * 4``.

    cvops needs no workspace; the size is reported as MLU-OPS reports it so callers can size buffers.
    """
    op = "mluOpGetPsRoiPoolWorkspaceSize"
    return workspace_query(op, handle, lambda: check_int(op, "output_dim", output_dim, min_value=1) * 4)


@returns_status
def psroipool_forward(handle, pooled_height, pooled_width, spatial_scale, group_size, output_dim,
                      input_desc, input, rois_desc, rois, workspace, workspace_size,
                      output_desc, output, mapping_channel_desc, mapping_channel):
    """``mluOpPsRoiPoolForward``: input ``[N, H, W, C]`` NHWC float, rois ``[R, 5]`` float ->
    output ``[R, PH, PW, output_dim]`` float and mapping_channel (same shape) int32, NHWC.

    Requires PH == PW == group_size and C == PH * PW * output_dim. A zero-element input is SUCCESS
    (nothing written), zero rois BAD_PARAM. Unlike MLU-OPS (which documents but does not check it), a
    batch index outside [0, N) is BAD_PARAM.
    """
    op = "mluOpPsRoiPoolForward"
    named = (("input_desc", input_desc), ("rois_desc", rois_desc), ("output_desc", output_desc),
             ("mapping_channel_desc", mapping_channel_desc))
    _psroipool_descriptors(op, named, (DataType.FLOAT, DataType.FLOAT, DataType.FLOAT, DataType.INT32))
    r, ph, pw, od = _psroipool_common(op, pooled_height, pooled_width, spatial_scale, output_dim, output_desc,
                                      rois_desc)
    require(isinstance(group_size, int) and not isinstance(group_size, bool), op,
            f"group_size must be an int, got {group_size!r}")
    require(group_size == ph, op, f"group_size ({group_size}) must equal pooled_height ({ph})")
    require(group_size >= 1, op, f"group_size must be >= 1, got {group_size}")
    c = input_desc.shape[3]
    require(c == ph * pw * od, op, f"input channels ({c}) must equal pooled_height * pooled_width * output_dim "
                                   f"({ph * pw * od})")
    require(output_desc.shape == mapping_channel_desc.shape, op,
            f"output shape {output_desc.shape} must equal mapping_channel shape {mapping_channel_desc.shape}")
    if input_desc.numel == 0:
        return Status.SUCCESS
    require(rois_desc.numel > 0, op, "rois must not be a zero-element tensor")
    check_workspace(op, workspace, workspace_size)
    x = check_data(op, "input", input_desc, input)
    boxes = check_data(op, "rois", rois_desc, rois)
    out = check_data(op, "output", output_desc, output)
    mapping = check_data(op, "mapping_channel", mapping_channel_desc, mapping_channel)
    result, channels = _psroi_pool(x, boxes, ph, pw, float(spatial_scale), group_size, od, "NHWC")
    out.copy_(result)
    mapping.copy_(channels)


@returns_status
def psroipool_backward(handle, pooled_height, pooled_width, spatial_scale, output_dim,
                       top_grad_desc, top_grad, rois_desc, rois, mapping_channel_desc, mapping_channel,
                       bottom_grad_desc, bottom_grad):
    """``mluOpPsRoiPoolBackward``: top_grad ``[R, PH, PW, output_dim]`` float, rois ``[R, 5]``,
    mapping_channel int32 -> bottom_grad ``[N, H, W, C]`` float (NHWC, overwritten; C = PH*PW*output_dim).

    Zero rois is BAD_PARAM (checked first); then zero elements in top_grad, mapping_channel or
    bottom_grad is SUCCESS with nothing written. The result is deterministic.
    """
    op = "mluOpPsRoiPoolBackward"
    named = (("top_grad_desc", top_grad_desc), ("rois_desc", rois_desc),
             ("mapping_channel_desc", mapping_channel_desc), ("bottom_grad_desc", bottom_grad_desc))
    _psroipool_descriptors(op, named, (DataType.FLOAT, DataType.FLOAT, DataType.INT32, DataType.FLOAT))
    r, ph, pw, od = _psroipool_common(op, pooled_height, pooled_width, spatial_scale, output_dim, top_grad_desc,
                                      rois_desc)
    c = bottom_grad_desc.shape[3]
    require(c == od * ph * pw, op, f"bottom_grad channels ({c}) must equal output_dim * pooled_width * "
                                   f"pooled_height ({od * ph * pw})")
    require(top_grad_desc.shape == mapping_channel_desc.shape, op,
            f"top_grad shape {top_grad_desc.shape} must equal mapping_channel shape {mapping_channel_desc.shape}")
    require(rois_desc.numel > 0, op, "rois must not be a zero-element tensor")
    if top_grad_desc.numel == 0 or mapping_channel_desc.numel == 0 or bottom_grad_desc.numel == 0:
        return Status.SUCCESS
    grad = check_data(op, "top_grad", top_grad_desc, top_grad)
    boxes = check_data(op, "rois", rois_desc, rois)
    mapping = check_data(op, "mapping_channel", mapping_channel_desc, mapping_channel)
    out = check_data(op, "bottom_grad", bottom_grad_desc, bottom_grad)
    out.copy_(_psroi_pool_backward(grad, boxes, mapping, float(spatial_scale), od, tuple(out.shape), "NHWC"))
