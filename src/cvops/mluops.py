"""MLU-OPS-style interface: handles, tensor descriptors, caller-allocated outputs, returned statuses.

Mirrors the C interfaces of the design docs (``mluOpPsamaskForward`` -> :func:`psamask_forward`, ...).
Every function takes a :class:`Handle` first and returns a :class:`Status`; the reason for a failure
is in ``handle.last_error``. Outputs are written in place into the tensors passed as data.
"""
from __future__ import annotations

import torch

from ._core.descriptor import (DataType, Handle, Layout, TensorDescriptor, check_data, check_descriptor,
                               create_handle, create_tensor_descriptor, descriptor_of, returns_status,
                               to_torch_dtype)
from ._core.errors import BadParamError, Status
from ._core.validate import require, require_supported


# ---------------------------------------------------------------------------------------------- psamask
def _psamask_check(op, psa_type, in_desc, out_desc, h_mask, w_mask):
    """``checkParams`` of kernels/psamask: in = x (dx), out = y (dy). All failures are BAD_PARAM.

    MLU-OPS also fails with NOT_SUPPORTED when one row does not fit its on-chip NRAM (``findLimit``);
    that limit belongs to the MLU, and cvops handles any channel count. Unlike MLU-OPS, an unknown
    ``psa_type`` is BAD_PARAM rather than a silent no-op (decisions.md).
    """
    from .ops.psamask.checks import psa_type_code
    psa_type_code(psa_type)
    for name, desc in (("input desc", in_desc), ("output desc", out_desc)):
        check_descriptor(op, name, desc)
        require(desc.dim == 4, op, f"{name} must be 4-D, got {desc.dim}-D")
        require(desc.layout == Layout.NHWC, op, f"{name} layout must be NHWC, got {desc.layout.name}")
        require(desc.dtype == DataType.FLOAT, op, f"{name} dtype must be FLOAT, got {desc.dtype.name}")
    require(in_desc.shape[:3] == out_desc.shape[:3], op,
            f"N, H, W of input {in_desc.shape[:3]} and output {out_desc.shape[:3]} must match")
    require(h_mask * w_mask == in_desc.shape[3], op,
            f"input channels ({in_desc.shape[3]}) must equal h_mask * w_mask ({h_mask * w_mask})")
    require(out_desc.shape[1] * out_desc.shape[2] == out_desc.shape[3], op,
            f"output channels ({out_desc.shape[3]}) must equal h_feature * w_feature")


@returns_status
def psamask_forward(handle, psa_type, x_desc, x, h_mask, w_mask, y_desc, y):
    """``mluOpPsamaskForward``: x ``[N, H, W, h_mask*w_mask]`` NHWC float -> y ``[N, H, W, H*W]``."""
    from .ops.psamask import psamask_forward as run
    op = "mluOpPsamaskForward"
    try:
        _psamask_check(op, psa_type, x_desc, y_desc, h_mask, w_mask)
    except NotImplementedError as err:  # the caller remaps every checkParams failure to BAD_PARAM
        raise BadParamError(op, str(err)) from err
    if x_desc.numel == 0:
        return Status.SUCCESS
    x, y = check_data(op, "x", x_desc, x), check_data(op, "y", y_desc, y)
    y.copy_(run(x, psa_type, (h_mask, w_mask), layout="NHWC"))


@returns_status
def psamask_backward(handle, psa_type, dy_desc, dy, h_mask, w_mask, dx_desc, dx):
    """``mluOpPsamaskBackward``: dy ``[N, H, W, H*W]`` NHWC float -> dx ``[N, H, W, h_mask*w_mask]``."""
    from .ops.psamask import psamask_backward as run
    op = "mluOpPsamaskBackward"
    try:
        _psamask_check(op, psa_type, dx_desc, dy_desc, h_mask, w_mask)
    except NotImplementedError as err:
        raise BadParamError(op, str(err)) from err
    if dy_desc.numel == 0:
        return Status.SUCCESS
    dy, dx = check_data(op, "dy", dy_desc, dy), check_data(op, "dx", dx_desc, dx)
    dx.copy_(run(dy, psa_type, (h_mask, w_mask), layout="NHWC"))


# -------------------------------------------------------------------------------------------- psroipool
def _psroipool_descriptors(op, named):
    """Non-null descriptors; 2^31 elements or bytes is NOT_SUPPORTED (MLU-OPS LARGE_TENSOR_SIZE)."""
    for name, desc in named:
        check_descriptor(op, name, desc)
    for name, desc in named:
        nbytes = desc.numel * (torch.empty((), dtype=to_torch_dtype(desc.dtype)).element_size()
                               if desc.dtype != DataType.INVALID else 1)
        require_supported(nbytes < 2**31, op, f"{name} has 2^31 or more bytes")


def _psroipool_common(op, pooled_height, pooled_width, spatial_scale, output_dim, pooled_desc, rois_desc):
    """The pooled-tensor checks shared by forward (output) and backward (top_grad); all BAD_PARAM."""
    for name, v in (("pooled_height", pooled_height), ("pooled_width", pooled_width), ("output_dim", output_dim)):
        require(isinstance(v, int) and not isinstance(v, bool), op, f"{name} must be an int, got {v!r}")
    r, ph, pw, od = pooled_desc.shape
    require(pooled_height == ph, op, f"pooled_height ({pooled_height}) must equal the pooled tensor's dim 1 ({ph})")
    require(pooled_width == pw, op, f"pooled_width ({pooled_width}) must equal the pooled tensor's dim 2 ({pw})")
    require(output_dim == od, op, f"output_dim ({output_dim}) must equal the pooled tensor's dim 3 ({od})")
    return r, ph, pw, od


def _check_scale_and_rois(op, spatial_scale, rois_desc, r):
    require(isinstance(spatial_scale, (int, float)) and spatial_scale > 0, op,
            f"spatial_scale must be > 0, got {spatial_scale!r}")
    require(rois_desc.shape[1] == 5, op, f"rois must be [R, 5], got {rois_desc.shape}")
    require(rois_desc.shape[0] == r, op, f"rois count ({rois_desc.shape[0]}) must equal the pooled tensor's dim 0 ({r})")


def get_psroipool_workspace_size(handle, output_dim):
    """``mluOpGetPsRoiPoolWorkspaceSize`` -> ``(status, size_in_bytes)``; the size is ``output_dim * 4``.

    cvops needs no workspace; the size is reported as MLU-OPS reports it so callers can size buffers.
    """
    op = "mluOpGetPsRoiPoolWorkspaceSize"
    if not isinstance(handle, Handle):
        return Status.BAD_PARAM, 0
    if not (isinstance(output_dim, int) and not isinstance(output_dim, bool) and output_dim >= 1):
        handle.last_error = f"{op}: output_dim must be an int >= 1, got {output_dim!r}"
        return Status.BAD_PARAM, 0
    handle.last_error = ""
    return Status.SUCCESS, output_dim * 4


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
    from .ops.psroipool import psroi_pool as run
    op = "mluOpPsRoiPoolForward"
    named = (("input_desc", input_desc), ("rois_desc", rois_desc), ("output_desc", output_desc),
             ("mapping_channel_desc", mapping_channel_desc))
    _psroipool_descriptors(op, named)
    for (name, desc), dim in zip(named, (4, 2, 4, 4)):
        require(desc.dim == dim, op, f"{name} must be {dim}-D, got {desc.dim}-D")
    for (name, desc), dtype in zip(named, (DataType.FLOAT, DataType.FLOAT, DataType.FLOAT, DataType.INT32)):
        require(desc.dtype == dtype, op, f"{name} dtype must be {dtype.name}, got {desc.dtype.name}")
    for name, desc in (named[0], named[2], named[3]):
        require(desc.layout == Layout.NHWC, op, f"{name} layout must be NHWC, got {desc.layout.name}")
    r, ph, pw, od = _psroipool_common(op, pooled_height, pooled_width, spatial_scale, output_dim, output_desc,
                                      rois_desc)
    require(isinstance(group_size, int) and not isinstance(group_size, bool), op,
            f"group_size must be an int, got {group_size!r}")
    require(group_size == ph, op, f"group_size ({group_size}) must equal pooled_height ({ph})")
    require(ph == pw, op, f"pooled_height ({ph}) must equal pooled_width ({pw})")
    require(group_size >= 1, op, f"group_size must be >= 1, got {group_size}")
    require(od >= 1, op, f"output_dim must be >= 1, got {od}")
    _check_scale_and_rois(op, spatial_scale, rois_desc, r)
    c = input_desc.shape[3]
    require(c == ph * pw * od, op, f"input channels ({c}) must equal pooled_height * pooled_width * output_dim "
                                   f"({ph * pw * od})")
    require(output_desc.shape == mapping_channel_desc.shape, op,
            f"output shape {output_desc.shape} must equal mapping_channel shape {mapping_channel_desc.shape}")
    if input_desc.numel == 0:
        return Status.SUCCESS
    require(rois_desc.numel > 0, op, "rois must not be a zero-element tensor")
    if workspace_size is not None and workspace_size > 0:
        require(workspace is not None, op, "workspace is null but workspace_size > 0")
    x = check_data(op, "input", input_desc, input)
    boxes = check_data(op, "rois", rois_desc, rois)
    out = check_data(op, "output", output_desc, output)
    mapping = check_data(op, "mapping_channel", mapping_channel_desc, mapping_channel)
    result, channels = run(x, boxes, ph, pw, float(spatial_scale), group_size, od, "NHWC")
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
    from .ops.psroipool import psroi_pool_backward as run
    op = "mluOpPsRoiPoolBackward"
    named = (("top_grad_desc", top_grad_desc), ("rois_desc", rois_desc),
             ("mapping_channel_desc", mapping_channel_desc), ("bottom_grad_desc", bottom_grad_desc))
    _psroipool_descriptors(op, named)
    for (name, desc), dim in zip(named, (4, 2, 4, 4)):
        require(desc.dim == dim, op, f"{name} must be {dim}-D, got {desc.dim}-D")
    for (name, desc), dtype in zip(named, (DataType.FLOAT, DataType.FLOAT, DataType.INT32, DataType.FLOAT)):
        require(desc.dtype == dtype, op, f"{name} dtype must be {dtype.name}, got {desc.dtype.name}")
    for name, desc in (named[0], named[2], named[3]):
        require(desc.layout == Layout.NHWC, op, f"{name} layout must be NHWC, got {desc.layout.name}")
    r, ph, pw, od = _psroipool_common(op, pooled_height, pooled_width, spatial_scale, output_dim, top_grad_desc,
                                      rois_desc)
    require(ph == pw, op, f"pooled_height ({ph}) must equal pooled_width ({pw})")
    require(od >= 1, op, f"output_dim must be >= 1, got {od}")
    _check_scale_and_rois(op, spatial_scale, rois_desc, r)
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
    out.copy_(run(grad, boxes, mapping, float(spatial_scale), od, tuple(out.shape), "NHWC"))
