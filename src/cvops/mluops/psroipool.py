"""psroipool: ``mluOpGetPsRoiPoolWorkspaceSize``, ``mluOpPsRoiPoolForward`` and ``mluOpPsRoiPoolBackward``
on NHWC descriptors and caller-allocated outputs."""
from __future__ import annotations

import math

from .._core.errors import Status
from .._core.validate import check_int, require, require_supported
from ..ops.psroipool import psroi_pool as _psroi_pool, psroi_pool_backward as _psroi_pool_backward
from .descriptor import DataType, Layout, check_descriptors, check_workspace, data_of, entry_point, require_each

__all__ = ["get_psroipool_workspace_size", "psroipool_backward", "psroipool_forward"]

_WORKSPACE, _FORWARD, _BACKWARD = "mluOpGetPsRoiPoolWorkspaceSize", "mluOpPsRoiPoolForward", "mluOpPsRoiPoolBackward"


def _check(op, descs: dict, pooled_name, feature_name, pooled_height, pooled_width, spatial_scale, output_dim):
    """The checks both directions share, all BAD_PARAM but the size limit: 2^31 elements or bytes is
    NOT_SUPPORTED (MLU-OPS LARGE_TENSOR_SIZE); the rois are ``[R, 5]`` float, the other tensors 4-D NHWC,
    int32 the mapping_channel and float the rest; the pooled tensor (output or top_grad) agrees with the
    arguments and the mapping_channel, the feature map (input or bottom_grad) has PH * PW * output_dim
    channels. Returns ``(PH, PW, output_dim)``."""
    check_descriptors(op, descs)
    for name, desc in descs.items():
        require_supported(desc.numel * desc.itemsize < 2**31, op, f"{name} has 2^31 or more bytes")
    for name, desc in descs.items():
        if name == "rois_desc":
            require_each(op, {name: desc}, dim=2, dtypes=(DataType.FLOAT,))
        else:
            dtype = DataType.INT32 if name == "mapping_channel_desc" else DataType.FLOAT
            require_each(op, {name: desc}, dim=4, layout=Layout.NHWC, dtypes=(dtype,))
    for name, v in (("pooled_height", pooled_height), ("pooled_width", pooled_width), ("output_dim", output_dim)):
        check_int(op, name, v)
    r, ph, pw, od = descs[pooled_name].shape
    require(pooled_height == ph, op, f"pooled_height ({pooled_height}) must equal the pooled tensor's dim 1 ({ph})")
    require(pooled_width == pw, op, f"pooled_width ({pooled_width}) must equal the pooled tensor's dim 2 ({pw})")
    require(output_dim == od, op, f"output_dim ({output_dim}) must equal the pooled tensor's dim 3 ({od})")
    require(ph == pw, op, f"pooled_height ({ph}) must equal pooled_width ({pw})")
    require(od >= 1, op, f"output_dim must be >= 1, got {od}")
    require(isinstance(spatial_scale, (int, float)) and not isinstance(spatial_scale, bool)
            and math.isfinite(spatial_scale) and spatial_scale > 0, op,
            f"spatial_scale must be a finite number > 0, got {spatial_scale!r}")
    rois_desc = descs["rois_desc"]
    require(rois_desc.shape[1] == 5, op, f"rois must be [R, 5], got {rois_desc.shape}")
    require(rois_desc.shape[0] == r, op,
            f"rois count ({rois_desc.shape[0]}) must equal the pooled tensor's dim 0 ({r})")
    c = descs[feature_name].shape[3]
    require(c == ph * pw * od, op, f"{feature_name[:-5]} channels ({c}) must equal pooled_height * pooled_width * "
                                   f"output_dim ({ph * pw * od})")
    mapping = descs["mapping_channel_desc"]
    require(mapping.shape == descs[pooled_name].shape, op, f"{pooled_name[:-5]} shape {descs[pooled_name].shape} "
            f"must equal mapping_channel shape {mapping.shape}")
    return ph, pw, od


@entry_point(_WORKSPACE, query=True)
def get_psroipool_workspace_size(handle, output_dim) -> tuple[Status, int]:
    """``mluOpGetPsRoiPoolWorkspaceSize`` -> ``(status, size_in_bytes)``; the size is ``output_dim * 4``.

    cvops needs no workspace; the size is reported as MLU-OPS reports it so callers can size buffers.
    """
    return check_int(_WORKSPACE, "output_dim", output_dim, min_value=1) * 4


@entry_point(_FORWARD)
def psroipool_forward(handle, pooled_height, pooled_width, spatial_scale, group_size, output_dim,
                      input_desc, input, rois_desc, rois, workspace, workspace_size,
                      output_desc, output, mapping_channel_desc, mapping_channel):
    """``mluOpPsRoiPoolForward``: input ``[N, H, W, C]`` NHWC float, rois ``[R, 5]`` float ->
    output ``[R, PH, PW, output_dim]`` float and mapping_channel (same shape) int32, NHWC.

    Requires PH == PW == group_size and C == PH * PW * output_dim. A zero-element input is SUCCESS
    (nothing written), zero rois BAD_PARAM. Unlike MLU-OPS (which documents but does not check it), a
    batch index outside [0, N) is BAD_PARAM.
    """
    op = _FORWARD
    descs = {"input_desc": input_desc, "rois_desc": rois_desc, "output_desc": output_desc,
             "mapping_channel_desc": mapping_channel_desc}
    ph, pw, od = _check(op, descs, "output_desc", "input_desc", pooled_height, pooled_width, spatial_scale,
                        output_dim)
    group_size = check_int(op, "group_size", group_size, min_value=1)
    require(group_size == ph, op, f"group_size ({group_size}) must equal pooled_height ({ph})")
    if input_desc.numel == 0:
        return
    require(rois_desc.numel > 0, op, "rois must not be a zero-element tensor")
    check_workspace(op, workspace, workspace_size)
    x, boxes, out, mapping = data_of(op, input=(input_desc, input), rois=(rois_desc, rois),
                                     output=(output_desc, output),
                                     mapping_channel=(mapping_channel_desc, mapping_channel))
    result, channels = _psroi_pool(x, boxes, ph, pw, float(spatial_scale), group_size, od, "NHWC")
    out.copy_(result)
    mapping.copy_(channels)


@entry_point(_BACKWARD)
def psroipool_backward(handle, pooled_height, pooled_width, spatial_scale, output_dim,
                       top_grad_desc, top_grad, rois_desc, rois, mapping_channel_desc, mapping_channel,
                       bottom_grad_desc, bottom_grad):
    """``mluOpPsRoiPoolBackward``: top_grad ``[R, PH, PW, output_dim]`` float, rois ``[R, 5]``,
    mapping_channel int32 -> bottom_grad ``[N, H, W, C]`` float (NHWC, overwritten; C = PH*PW*output_dim).

    Zero rois is BAD_PARAM (checked first); then zero elements in top_grad, mapping_channel or
    bottom_grad is SUCCESS with nothing written. The result is deterministic.
    """
    op = _BACKWARD
    descs = {"top_grad_desc": top_grad_desc, "rois_desc": rois_desc, "mapping_channel_desc": mapping_channel_desc,
             "bottom_grad_desc": bottom_grad_desc}
    ph, pw, od = _check(op, descs, "top_grad_desc", "bottom_grad_desc", pooled_height, pooled_width, spatial_scale,
                        output_dim)
    require(rois_desc.numel > 0, op, "rois must not be a zero-element tensor")
    if top_grad_desc.numel == 0 or mapping_channel_desc.numel == 0 or bottom_grad_desc.numel == 0:
        return
    grad, boxes, mapping, out = data_of(op, top_grad=(top_grad_desc, top_grad), rois=(rois_desc, rois),
                                        mapping_channel=(mapping_channel_desc, mapping_channel),
                                        bottom_grad=(bottom_grad_desc, bottom_grad))
    out.copy_(_psroi_pool_backward(grad, boxes, mapping, float(spatial_scale), od, tuple(out.shape), "NHWC"))
