"""MLU-OPS-style interface: handles, tensor descriptors, caller-allocated outputs, returned statuses.

Mirrors the C interfaces of the design docs (``mluOpPsamaskForward`` -> :func:`psamask_forward`, ...).
Every function takes a :class:`Handle` first and returns a :class:`Status`; the reason for a failure
is in ``handle.last_error``. Outputs are written in place into the tensors passed as data.
"""
from __future__ import annotations

import math

import torch

from ._core.descriptor import (DataType, Handle, Layout, TensorDescriptor, check_data, check_descriptor,
                               create_handle, create_tensor_descriptor, descriptor_of, returns_status,
                               status_of, to_torch_dtype)
from ._core.errors import BadParamError, Status
from ._core.validate import check_int, require, require_supported


# ---------------------------------------------------------------------------------------------
# carafe (mluOpCreateCarafeDescriptor / mluOpSetCarafeDescriptor / mluOpCarafeForward / Backward)

from dataclasses import dataclass as _dataclass  # noqa: E402



@_dataclass
class CarafeDescriptor:
    """``mluOpCarafeDescriptor_t``: dimension count, kernel size, group size and scale factor."""

    dimNb: int = 0
    kernel_size: int = 0
    group_size: int = 0
    scale_factor: int = 0


def create_carafe_descriptor() -> CarafeDescriptor:
    """``mluOpCreateCarafeDescriptor`` (unset: every field 0)."""
    return CarafeDescriptor()


def set_carafe_descriptor(desc: CarafeDescriptor, dimNb: int, kernel_size: int, group_size: int,
                          scale_factor: int) -> Status:
    """``mluOpSetCarafeDescriptor``: BAD_PARAM unless dimNb == 4, k odd >= 1, G >= 1, s >= 1."""
    op = "set_carafe_descriptor"

    def store():
        require(isinstance(desc, CarafeDescriptor), op, "carafe_desc is null")
        values = _carafe_values(op, dimNb, kernel_size, group_size, scale_factor)
        desc.dimNb, desc.kernel_size, desc.group_size, desc.scale_factor = values

    return status_of(op, None, store)[0]


def _carafe_values(op: str, dimNb, kernel_size, group_size, scale_factor) -> tuple[int, int, int, int]:
    dimNb = check_int(op, "dimNb", dimNb)
    require(dimNb == 4, op, f"dimNb must be 4, got {dimNb}")
    kernel_size = check_int(op, "kernel_size", kernel_size)
    require(kernel_size >= 1 and kernel_size % 2 == 1, op, f"kernel_size must be odd and >= 1, got {kernel_size}")
    group_size = check_int(op, "group_size", group_size, min_value=1)
    scale_factor = check_int(op, "scale_factor", scale_factor, min_value=1)
    return dimNb, kernel_size, group_size, scale_factor


def _carafe_desc_params(op: str, carafe_desc) -> tuple[int, int, int]:
    require(isinstance(carafe_desc, CarafeDescriptor), op, "carafe_desc is null")
    d = carafe_desc
    return _carafe_values(op, d.dimNb, d.kernel_size, d.group_size, d.scale_factor)[1:]


def _carafe_shapes(op: str, descs: dict, k: int, g: int, s: int, out_names: tuple[str, ...]) -> None:
    """The shape rules of both directions on NHWC descriptors (semantics.md §4)."""
    from .ops.carafe.checks import check_shapes
    for name, d in descs.items():
        require(d.dim == 4, op, f"{name} must be 4-D, got {d.dim}-D")
    for name, d in descs.items():
        require(d.layout == Layout.NHWC, op, f"{name} layout must be NHWC, got {d.layout.name}")
    inp, mask = descs["input_desc"], descs["mask_desc"]
    n, h, w, c = inp.shape
    for name, d in descs.items():
        require(d.shape[0] == n, op, f"{name} batch ({d.shape[0]}) must equal input batch ({n})")
    for name in out_names:
        d = descs[name]
        if name.startswith("grad_mask"):
            require(d.shape == mask.shape, op, f"{name} shape {d.shape} must equal mask shape {mask.shape}")
        elif name == "grad_input_desc":
            require(d.shape == inp.shape, op, f"{name} shape {d.shape} must equal input shape {inp.shape}")
        else:
            require(d.shape[1:3] == mask.shape[1:3], op,
                    f"{name} spatial size {d.shape[1:3]} must equal mask spatial size {mask.shape[1:3]}")
            require(d.shape[3] == c, op, f"{name} channels ({d.shape[3]}) must equal input channels ({c})")
    check_shapes(op, (n, c, h, w), (mask.shape[0], mask.shape[3], mask.shape[1], mask.shape[2]), k, g, s)


def _carafe_dtypes(op: str, descs: dict) -> None:
    first = next(iter(descs.values())).dtype
    for name, d in descs.items():
        require(d.dtype in (DataType.HALF, DataType.FLOAT), op, f"{name} dtype must be HALF or FLOAT, got {d.dtype.name}")
        require(d.dtype == first, op, f"{name} dtype ({d.dtype.name}) must equal the other tensors' ({first.name})")


@returns_status
def carafe_forward(handle: Handle, carafe_desc: CarafeDescriptor, input_desc: TensorDescriptor, input,
                   mask_desc: TensorDescriptor, mask, output_desc: TensorDescriptor, output) -> None:
    """``mluOpCarafeForward``: NHWC input ``[N, H, W, C]``, mask ``[N, sH, sW, G*k*k]`` -> output
    ``[N, sH, sW, C]`` written in place. k > 45 or s > 5 is NOT_SUPPORTED; an empty tensor is SUCCESS."""
    op = "carafe_forward"
    descs = {"input_desc": input_desc, "mask_desc": mask_desc, "output_desc": output_desc}
    for name, d in descs.items():
        check_descriptor(op, name, d)
    k, g, s = _carafe_desc_params(op, carafe_desc)
    require_supported(k <= 45, op, f"kernel_size ({k}) > 45 is not supported")
    require_supported(s <= 5, op, f"scale_factor ({s}) > 5 is not supported")
    for name, d in descs.items():
        require(d.dim == 4, op, f"{name} must be 4-D, got {d.dim}-D")
    for name, d in descs.items():
        require(d.layout == Layout.NHWC, op, f"{name} layout must be NHWC, got {d.layout.name}")
    for name, t in (("input", input), ("mask", mask), ("output", output)):
        require(not isinstance(t, torch.Tensor) or t.is_contiguous(), op, f"{name} must be contiguous")
    _carafe_dtypes(op, descs)
    _carafe_shapes(op, descs, k, g, s, ("output_desc",))
    if any(d.numel == 0 for d in descs.values()):
        return None
    x = check_data(op, "input", input_desc, input)
    m = check_data(op, "mask", mask_desc, mask)
    y = check_data(op, "output", output_desc, output)
    from .ops.carafe import carafe_forward as _fwd
    with torch.no_grad():
        y.copy_(_fwd(x, m, k, g, s, layout="NHWC"))
    return None


@returns_status
def carafe_backward(handle: Handle, carafe_desc: CarafeDescriptor, input_desc: TensorDescriptor, input,
                    mask_desc: TensorDescriptor, mask, grad_output_desc: TensorDescriptor, grad_output,
                    grad_input_desc: TensorDescriptor, grad_input, grad_mask_desc: TensorDescriptor,
                    grad_mask) -> None:
    """``mluOpCarafeBackward``: writes grad_input ``[N, H, W, C]`` and grad_mask ``[N, sH, sW, G*k*k]``
    (NHWC) in place. Non-contiguous data is NOT_SUPPORTED; k > 137 is NOT_SUPPORTED; an empty tensor
    is SUCCESS. The result is deterministic (gather, no atomics)."""
    op = "carafe_backward"
    descs = {"input_desc": input_desc, "mask_desc": mask_desc, "grad_output_desc": grad_output_desc,
             "grad_input_desc": grad_input_desc, "grad_mask_desc": grad_mask_desc}
    for name, d in descs.items():
        check_descriptor(op, name, d)
    k, g, s = _carafe_desc_params(op, carafe_desc)
    _carafe_shapes(op, descs, k, g, s, ("grad_output_desc", "grad_input_desc", "grad_mask_desc"))
    _carafe_dtypes(op, descs)
    for name, t in (("input", input), ("mask", mask), ("grad_output", grad_output), ("grad_input", grad_input),
                    ("grad_mask", grad_mask)):
        require_supported(not isinstance(t, torch.Tensor) or t.is_contiguous(), op,
                          f"{name} must be contiguous (stride tensors are not supported)")
    if any(d.numel == 0 for d in descs.values()):
        return None
    x = check_data(op, "input", input_desc, input)
    m = check_data(op, "mask", mask_desc, mask)
    gy = check_data(op, "grad_output", grad_output_desc, grad_output)
    gx = check_data(op, "grad_input", grad_input_desc, grad_input)
    gm = check_data(op, "grad_mask", grad_mask_desc, grad_mask)
    require_supported(k <= 137, op, f"kernel_size ({k}) > 137 is not supported")
    from .ops.carafe import carafe_backward as _bwd
    with torch.no_grad():
        gi, gmask = _bwd(gy, x, m, k, g, s, layout="NHWC")
    gx.copy_(gi)
    gm.copy_(gmask)
    return None
# masked_im2col (mluOpGetMaskedIm2colForwardWorkspaceSize, mluOpMaskedIm2colForward)

from .ops.masked_im2col import masked_im2col as _masked_im2col  # noqa: E402

_MASKED_IM2COL = "mluOpMaskedIm2colForward"


def _masked_im2col_pre_check(feature_desc, mask_h_idx_desc, mask_w_idx_desc, data_col_desc, kernel_h, kernel_w):
    """The MLU-OPS host checks, in their order; returns ``(feature_desc, data_col_desc, M)``."""
    op = _MASKED_IM2COL
    feature_desc = check_descriptor(op, "feature_desc", feature_desc)
    mask_h_idx_desc = check_descriptor(op, "mask_h_idx_desc", mask_h_idx_desc)
    mask_w_idx_desc = check_descriptor(op, "mask_w_idx_desc", mask_w_idx_desc)
    data_col_desc = check_descriptor(op, "data_col_desc", data_col_desc)
    require(feature_desc.layout == Layout.NCHW, op, f"feature layout must be NCHW, got {feature_desc.layout.name}")
    require(feature_desc.dim == 4, op, f"feature must be 4-D, got {feature_desc.dim}-D")
    require(feature_desc.dtype in (DataType.FLOAT, DataType.HALF), op,
            f"feature dtype must be FLOAT or HALF, got {feature_desc.dtype.name}")
    require(feature_desc.dtype == data_col_desc.dtype, op,
            f"data_col dtype ({data_col_desc.dtype.name}) must equal feature dtype ({feature_desc.dtype.name})")
    for name, desc in (("mask_h_idx", mask_h_idx_desc), ("mask_w_idx", mask_w_idx_desc)):
        require(desc.dtype == DataType.INT32, op, f"{name} dtype must be INT32, got {desc.dtype.name}")
    require(feature_desc.shape[0] == 1, op, f"feature dims[0] (batch) must be 1, got {feature_desc.shape[0]}")
    require(mask_h_idx_desc.dim == 1, op, f"mask_h_idx must be 1-D, got {mask_h_idx_desc.dim}-D")
    require(mask_w_idx_desc.dim == 1, op, f"mask_w_idx must be 1-D, got {mask_w_idx_desc.dim}-D")
    require(mask_h_idx_desc.shape[0] == mask_w_idx_desc.shape[0], op,
            f"mask_h_idx length ({mask_h_idx_desc.shape[0]}) must equal mask_w_idx length ({mask_w_idx_desc.shape[0]})")
    require(data_col_desc.dim == 2, op, f"data_col must be 2-D, got {data_col_desc.dim}-D")
    kernel_h = check_int(op, "kernel_h", kernel_h)
    kernel_w = check_int(op, "kernel_w", kernel_w)
    channels = feature_desc.shape[1]
    require(data_col_desc.shape[0] == channels * kernel_h * kernel_w, op,
            f"data_col dims[0] ({data_col_desc.shape[0]}) must equal channels * kernel_h * kernel_w "
            f"({channels} * {kernel_h} * {kernel_w})")
    require(data_col_desc.shape[1] == mask_h_idx_desc.shape[0], op,
            f"data_col dims[1] ({data_col_desc.shape[1]}) must equal the mask count ({mask_h_idx_desc.shape[0]})")
    require(kernel_h > 0, op, f"kernel_h must be > 0, got {kernel_h}")
    require(kernel_w > 0, op, f"kernel_w must be > 0, got {kernel_w}")
    require(feature_desc.numel > 0 and data_col_desc.shape[0] > 0, op,
            "zero-element feature or data_col dims[0] is not supported (BAD_PARAM)")
    return feature_desc, data_col_desc, mask_h_idx_desc.shape[0]


def get_masked_im2col_forward_workspace_size(handle, feature_desc, mask_h_idx_desc, mask_w_idx_desc, kernel_h,
                                             kernel_w, data_col_desc) -> tuple[Status, int]:
    """``mluOpGetMaskedIm2colForwardWorkspaceSize``: returns ``(status, workspace_size)``.

    The size is the MLU-OPS one: feature bytes + data_col bytes (its NHWC staging copies); the
    transposes here need no extra space. 0 when there are no mask points or on failure.
    """
    size = [0]

    @returns_status
    def query(handle):
        feature_desc_, data_col_desc_, mask_cnt = _masked_im2col_pre_check(
            feature_desc, mask_h_idx_desc, mask_w_idx_desc, data_col_desc, kernel_h, kernel_w)
        if mask_cnt == 0:
            return
        itemsize = torch.empty((), dtype=to_torch_dtype(feature_desc_.dtype)).element_size()
        size[0] = (feature_desc_.numel + data_col_desc_.numel) * itemsize

    status = query(handle)
    return status, size[0]


@returns_status
def masked_im2col_forward(handle, feature_desc, feature, mask_h_idx_desc, mask_h_idx, mask_w_idx_desc, mask_w_idx,
                          kernel_h, kernel_w, pad_h, pad_w, workspace, workspace_size, data_col_desc, data_col):
    """``mluOpMaskedIm2colForward``: writes ``data_col [C*kh*kw, M]`` in place.

    Statuses as in MLU-OPS: every descriptor rule is BAD_PARAM (2^31 elements: NOT_SUPPORTED);
    empty feature or ``data_col.dims[0] == 0``: BAD_PARAM; ``M == 0``: SUCCESS without writing;
    then a null workspace with ``workspace_size > 0`` or a null data pointer: BAD_PARAM.
    Index values are not checked (any value is legal: taps outside the feature read 0); beyond
    MLU-OPS, a padding with ``|pad| + kernel + feature size >= 2**63`` (window coordinates that
    would wrap in int64) is BAD_PARAM.
    """
    op = _MASKED_IM2COL
    feature_desc, data_col_desc, mask_cnt = _masked_im2col_pre_check(
        feature_desc, mask_h_idx_desc, mask_w_idx_desc, data_col_desc, kernel_h, kernel_w)
    if mask_cnt == 0:
        return
    workspace_size = check_int(op, "workspace_size", workspace_size, min_value=0)
    require(workspace_size == 0 or workspace is not None, op, "workspace is null but workspace_size > 0")
    feature = check_data(op, "feature", feature_desc, feature)
    mask_h_idx = check_data(op, "mask_h_idx", mask_h_idx_desc, mask_h_idx)
    mask_w_idx = check_data(op, "mask_w_idx", mask_w_idx_desc, mask_w_idx)
    data_col = check_data(op, "data_col", data_col_desc, data_col)
    pad_h = check_int(op, "pad_h", pad_h)
    pad_w = check_int(op, "pad_w", pad_w)
    with torch.no_grad():
        data_col.copy_(_masked_im2col(feature, mask_h_idx, mask_w_idx, (int(kernel_h), int(kernel_w)),
                                      (pad_h, pad_w)))
# ---------------------------------------------------------------------------------------------- psamask
def _psamask_check(op, psa_type, in_desc, out_desc, h_mask, w_mask):
    """``checkParams`` of kernels/psamask: in = x (dx), out = y (dy). All failures are BAD_PARAM.

    MLU-OPS also fails with NOT_SUPPORTED when one row does not fit its on-chip NRAM (``findLimit``);
    that limit belongs to the MLU, and cvops handles any channel count. Unlike MLU-OPS, an unknown
    ``psa_type`` is BAD_PARAM rather than a silent no-op (decisions.md).
    """
    from .ops.psamask.checks import psa_type_code
    psa_type_code(psa_type)
    h_mask = check_int(op, "h_mask", h_mask, min_value=1)
    w_mask = check_int(op, "w_mask", w_mask, min_value=1)
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
def _psroipool_descriptors(op, named, dtypes):
    """Non-null descriptors; 2^31 elements or bytes is NOT_SUPPORTED (MLU-OPS LARGE_TENSOR_SIZE); then
    dims (4, 2, 4, 4), the given dtypes, and NHWC for every tensor but the rois (second) -- BAD_PARAM."""
    for name, desc in named:
        check_descriptor(op, name, desc)
    for name, desc in named:
        nbytes = desc.numel * (torch.empty((), dtype=to_torch_dtype(desc.dtype)).element_size()
                               if desc.dtype != DataType.INVALID else 1)
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
    workspace_size = check_int(op, "workspace_size", workspace_size, min_value=0)
    require(workspace_size == 0 or workspace is not None, op, "workspace is null but workspace_size > 0")
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
    out.copy_(run(grad, boxes, mapping, float(spatial_scale), od, tuple(out.shape), "NHWC"))
# ---------------------------------------------------------------------------------------------------
# get_indice_pairs (mluOpGetIndicePairs): sparse-convolution descriptor, workspace query, kernel map
# ---------------------------------------------------------------------------------------------------
from dataclasses import dataclass as _dataclass, field as _field  # noqa: E402

from ._core.validate import check_int as _check_int  # noqa: E402

_GIP = "mluOpGetIndicePairs"
_GIP_MAX_KERNEL_VOLUME = 4096      # mmcv / MLU-OPS KernelMaxVolume
_GIP_MAX_INPUT_SITES = 1_000_000   # MLU-OPS INDICE_IN_LARGE_TENSOR_NUM


@_dataclass
class SparseConvolutionDescriptor:
    """``mluOpSparseConvolutionDescriptor_t``: geometry of a 3-D sparse conv and, after
    :func:`get_indice_pairs`, the number of active output sites (``num_act_out``)."""

    dimNb: int = 0
    batch: int = 0
    pad: tuple = ()
    stride: tuple = ()
    dilation: tuple = ()
    input_space: tuple = ()
    filter_space: tuple = ()
    output_space: tuple = ()
    sub_m: int = 0
    transpose: int = 0
    inverse: int = 0
    num_act_out: int = 0
    _set: bool = _field(default=False, repr=False)


def create_sparse_convolution_descriptor() -> SparseConvolutionDescriptor:
    """``mluOpCreateSparseConvolutionDescriptor``."""
    return SparseConvolutionDescriptor()


def set_sparse_convolution_descriptor(desc, dimNb, batch, pad, stride, dilation, input_space, filter_space,
                                      output_space, sub_m=0, transpose=0, inverse=0) -> Status:
    """``mluOpSetSparseConvolutionDescriptor``. BAD_PARAM unless dimNb == 5 (3-D), batch > 0,
    transpose == 0, inverse == 0, and per dimension pad >= 0, stride, dilation, input, filter and
    output sizes >= 1."""
    op = "mluOpSetSparseConvolutionDescriptor"

    def store():
        _set_sparse_convolution_descriptor(op, desc, dimNb, batch, pad, stride, dilation, input_space,
                                           filter_space, output_space, sub_m, transpose, inverse)

    return status_of(op, None, store)[0]


def _set_sparse_convolution_descriptor(op, desc, dimNb, batch, pad, stride, dilation, input_space, filter_space,
                                       output_space, sub_m, transpose, inverse) -> None:
    require(isinstance(desc, SparseConvolutionDescriptor), op, "sparse_conv_desc is null")
    for name, arr in (("pad", pad), ("stride", stride), ("dilation", dilation), ("input_space", input_space),
                      ("filter_space", filter_space), ("output_space", output_space)):
        require(arr is not None, op, f"{name} is null")
        require(isinstance(arr, (tuple, list, torch.Size)), op, f"{name} must be a sequence of ints, got {arr!r}")
    dimNb = _check_int(op, "dimNb", dimNb)
    require(dimNb == 5, op, f"only 3-D sparse convolution is supported: dimNb must be 5, got {dimNb}")
    batch = _check_int(op, "batch", batch)
    require(batch > 0, op, f"batch must be > 0, got {batch}")
    sub_m = _check_int(op, "sub_m", sub_m)
    require(_check_int(op, "transpose", transpose) == 0, op, f"transpose is not supported, got {transpose}")
    require(_check_int(op, "inverse", inverse) == 0, op, f"inverse is not supported, got {inverse}")
    arrays = {}
    for name, arr, low in (("pad", pad, 0), ("stride", stride, 1), ("dilation", dilation, 1),
                           ("input_space", input_space, 1), ("filter_space", filter_space, 1),
                           ("output_space", output_space, 1)):
        values = tuple(_check_int(op, name, v) for v in arr)
        require(len(values) >= dimNb - 2, op, f"{name} must have {dimNb - 2} entries, got {len(values)}")
        values = values[:dimNb - 2]
        for idx, v in enumerate(values):
            require(v >= low, op, f"{name}[{idx}] must be >= {low}, got {v}")
        arrays[name] = values
    desc.dimNb, desc.batch, desc.sub_m, desc.transpose, desc.inverse = dimNb, batch, int(sub_m != 0), 0, 0
    for name, values in arrays.items():
        setattr(desc, name, values)
    desc._set = True


def get_sparse_convolution_num_act_out(desc) -> tuple[Status, int]:
    """``mluOpGetSparseConvolutionNumActOut``: ``(status, num_act_out)``; NOT_INITIALIZED for a null desc."""
    if not isinstance(desc, SparseConvolutionDescriptor):
        return Status.NOT_INITIALIZED, 0
    return Status.SUCCESS, desc.num_act_out


def _gip_pre_check(sparse_conv_desc, indices_desc, indice_pairs_desc, out_indices_desc, indice_num_desc):
    """The descriptor checks of ``internalGetIndicePairs``, in its order. True: zero elements."""
    op = _GIP
    require(isinstance(sparse_conv_desc, SparseConvolutionDescriptor), op, "sparse_conv_desc is null")
    require(sparse_conv_desc._set, op, "sparse_conv_desc was not set (mluOpSetSparseConvolutionDescriptor)")
    for name, d in (("indices_desc", indices_desc), ("indice_pairs_desc", indice_pairs_desc),
                    ("out_indices_desc", out_indices_desc), ("indice_num_desc", indice_num_desc)):
        require(d is not None, op, f"{name} is null")
        require(isinstance(d, TensorDescriptor), op, f"{name} must be a TensorDescriptor")
        require(all(s >= 0 for s in d.shape), op, f"{name} sizes must be >= 0, got {d.shape}")
    desc = sparse_conv_desc
    require(indices_desc.dim == 2, op, f"indices must be 2-D, got {indices_desc.shape}")
    require(indice_pairs_desc.dim == 3, op, f"indice_pairs must be 3-D, got {indice_pairs_desc.shape}")
    require(out_indices_desc.dim == 2, op, f"out_indices must be 2-D, got {out_indices_desc.shape}")
    require(indice_num_desc.dim == 1, op, f"indice_num must be 1-D, got {indice_num_desc.shape}")
    require(indices_desc.shape[1] == 4, op, f"indices must be [L, 4], got {indices_desc.shape}")
    require(out_indices_desc.shape[1] == 4, op, f"out_indices must be [M, 4], got {out_indices_desc.shape}")
    require(indice_pairs_desc.shape[1] == 2, op, f"indice_pairs must be [K, 2, L], got {indice_pairs_desc.shape}")
    L = indices_desc.shape[0]
    require(indice_pairs_desc.shape[2] == L, op,
            f"indice_pairs dims[2] ({indice_pairs_desc.shape[2]}) must equal indices dims[0] ({L})")
    require(indice_pairs_desc.shape[0] == indice_num_desc.shape[0], op,
            f"indice_pairs dims[0] ({indice_pairs_desc.shape[0]}) must equal indice_num dims[0] "
            f"({indice_num_desc.shape[0]})")
    kernel_volume = out_volume = in_volume = 1
    for k, o, i in zip(desc.filter_space, desc.output_space, desc.input_space):
        kernel_volume, out_volume, in_volume = kernel_volume * k, out_volume * o, in_volume * i
    require(L <= desc.batch * in_volume, op, f"indices dims[0] ({L}) must be <= batch * prod(input_space) "
            f"({desc.batch * in_volume})")
    for d, (p, s, dil) in enumerate(zip(desc.pad, desc.stride, desc.dilation)):
        require(p >= 0 and dil >= 1 and s >= 1, op, f"pad[{d}] >= 0, stride[{d}] >= 1, dilation[{d}] >= 1 violated")
        require(dil == 1 or s == 1, op, f"dilation[{d}] ({dil}) and stride[{d}] ({s}) cannot both be > 1")
    require(indice_pairs_desc.shape[0] == kernel_volume, op,
            f"indice_pairs dims[0] ({indice_pairs_desc.shape[0]}) must equal prod(filter_space) ({kernel_volume})")
    require(kernel_volume <= _GIP_MAX_KERNEL_VOLUME, op,
            f"prod(filter_space) ({kernel_volume}) must be <= {_GIP_MAX_KERNEL_VOLUME}")
    require(out_indices_desc.shape[0] <= desc.batch * out_volume, op,
            f"out_indices dims[0] ({out_indices_desc.shape[0]}) must be <= batch * prod(output_space) "
            f"({desc.batch * out_volume})")
    require(L <= _GIP_MAX_INPUT_SITES, op, f"indices dims[0] ({L}) must be <= {_GIP_MAX_INPUT_SITES}")
    for name, d in (("indices", indices_desc), ("out_indices", out_indices_desc),
                    ("indice_pairs", indice_pairs_desc), ("indice_num", indice_num_desc)):
        check_descriptor(op, name, d)  # 2^31 elements or more: NOT_SUPPORTED
    for name, d in (("indices", indices_desc), ("indice_pairs", indice_pairs_desc),
                    ("out_indices", out_indices_desc), ("indice_num", indice_num_desc)):
        require(d.dtype == DataType.INT32, op, f"{name} dtype must be INT32, got {d.dtype.name}")
    if desc.sub_m:
        for d in range(len(desc.input_space)):
            require(desc.input_space[d] == desc.output_space[d], op,
                    f"subm requires input_space[{d}] ({desc.input_space[d]}) == output_space[{d}] "
                    f"({desc.output_space[d]})")
            require(desc.stride[d] == 1, op, f"subm requires stride[{d}] == 1, got {desc.stride[d]}")
            require(desc.dilation[d] == 1, op, f"subm requires dilation[{d}] == 1, got {desc.dilation[d]}")
    return any(d.numel == 0 for d in (indices_desc, indice_pairs_desc, out_indices_desc, indice_num_desc))


def get_indice_pairs_workspace_size(handle, sparse_conv_desc, indices_desc, indice_pairs_desc, out_indices_desc,
                                    indice_num_desc) -> tuple[Status, int]:
    """``mluOpGetIndicePairsWorkspaceSize``: ``(status, workspace_size)``.

    The size is what the sort-based join here allocates: an int64 key per (offset, input row) slot
    plus the sorted keys and their order (0 for zero-element tensors or on failure).
    """
    size = [0]

    @returns_status
    def query(handle):
        # MLU-OPS answers 0 for a zero-element tensor before its other checks (only null descriptors fail)
        require(isinstance(sparse_conv_desc, SparseConvolutionDescriptor), _GIP, "sparse_conv_desc is null")
        descs = (indices_desc, indice_pairs_desc, out_indices_desc, indice_num_desc)
        for name, d in zip(("indices_desc", "indice_pairs_desc", "out_indices_desc", "indice_num_desc"), descs):
            require(isinstance(d, TensorDescriptor), _GIP, f"{name} is null")
        if any(d.numel == 0 for d in descs):
            return
        _gip_pre_check(sparse_conv_desc, *descs)
        L, K = indices_desc.shape[0], indice_pairs_desc.shape[0]
        size[0] = 8 * K * L + 16 * L

    status = query(handle)
    return status, size[0]


@returns_status
def get_indice_pairs(handle, sparse_conv_desc, indices_desc, indices, workspace, workspace_size,
                     indice_pairs_desc, indice_pairs, out_indices_desc, out_indices, indice_num_desc, indice_num):
    """``mluOpGetIndicePairs``: writes ``indice_pairs [K, 2, L]``, ``out_indices [num_act_out, 4]`` (the
    first rows of ``out_indices``) and ``indice_num [K]`` in place; ``num_act_out`` is stored in
    ``sparse_conv_desc`` (read it with :func:`get_sparse_convolution_num_act_out`).

    Statuses as in MLU-OPS (semantics.md §5): every descriptor rule is BAD_PARAM (2^31 elements:
    NOT_SUPPORTED); any zero-element tensor: SUCCESS with ``num_act_out = 0`` and outputs untouched;
    then null data or a null workspace with ``workspace_size > 0``: BAD_PARAM. Beyond MLU-OPS (which
    would write out of bounds), index values outside ``[0, batch) x [0, input_space)``, duplicate subm
    sites and an ``out_indices`` too short for the active output sites are BAD_PARAM, with nothing written.
    """
    op = _GIP
    desc = sparse_conv_desc
    if _gip_pre_check(desc, indices_desc, indice_pairs_desc, out_indices_desc, indice_num_desc):
        desc.num_act_out = 0
        return
    workspace_size = _check_int(op, "workspace_size", workspace_size, min_value=0)
    indices = check_data(op, "indices", indices_desc, indices)
    indice_pairs = check_data(op, "indice_pairs", indice_pairs_desc, indice_pairs)
    out_indices = check_data(op, "out_indices", out_indices_desc, out_indices)
    indice_num = check_data(op, "indice_num", indice_num_desc, indice_num)
    require(workspace_size == 0 or workspace is not None, op, "workspace is null but workspace_size > 0")
    from .ops.get_indice_pairs import get_indice_pairs as _functional
    out, pairs, num = _functional(indices, desc.batch, list(desc.input_space), list(desc.filter_space),
                                  list(desc.stride), list(desc.pad), list(desc.dilation), 0,
                                  subm=bool(desc.sub_m), out_spatial_shape=list(desc.output_space))
    num_act_out = out.shape[0]
    require(num_act_out <= out_indices.shape[0], op,
            f"out_indices has {out_indices.shape[0]} rows but there are {num_act_out} active output sites")
    with torch.no_grad():
        out_indices[:num_act_out].copy_(out)
        indice_pairs.copy_(pairs)
        indice_num.copy_(num)
    desc.num_act_out = num_act_out
