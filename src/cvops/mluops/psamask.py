"""MLU-OPS interface of psamask: ``mluOpPsamaskForward`` and ``mluOpPsamaskBackward`` on NHWC float
descriptors and caller-allocated outputs."""
from __future__ import annotations

from .descriptor import DataType, Layout, check_data, check_descriptor, returns_status
from .._core.errors import BadParamError, Status
from .._core.validate import check_int, require
from ..ops.psamask import psamask_backward as _psamask_backward, psamask_forward as _psamask_forward
from ..ops.psamask.checks import psa_type_code

__all__ = ["psamask_backward", "psamask_forward"]


def _psamask_check(op, psa_type, in_desc, out_desc, h_mask, w_mask):
    """``checkParams`` of kernels/psamask: in = x (dx), out = y (dy). All failures are BAD_PARAM.

    MLU-OPS also fails with NOT_SUPPORTED when one row does not fit its on-chip NRAM (``findLimit``);
    that limit belongs to the MLU, and cvops handles any channel count. Unlike MLU-OPS, an unknown
    ``psa_type`` is BAD_PARAM rather than a silent no-op (decisions.md).
    """
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
    op = "mluOpPsamaskForward"
    try:
        _psamask_check(op, psa_type, x_desc, y_desc, h_mask, w_mask)
    except NotImplementedError as err:  # the caller remaps every checkParams failure to BAD_PARAM
        raise BadParamError(op, str(err)) from err
    if x_desc.numel == 0:
        return Status.SUCCESS
    x, y = check_data(op, "x", x_desc, x), check_data(op, "y", y_desc, y)
    y.copy_(_psamask_forward(x, psa_type, (h_mask, w_mask), layout="NHWC"))


@returns_status
def psamask_backward(handle, psa_type, dy_desc, dy, h_mask, w_mask, dx_desc, dx):
    """``mluOpPsamaskBackward``: dy ``[N, H, W, H*W]`` NHWC float -> dx ``[N, H, W, h_mask*w_mask]``."""
    op = "mluOpPsamaskBackward"
    try:
        _psamask_check(op, psa_type, dx_desc, dy_desc, h_mask, w_mask)
    except NotImplementedError as err:
        raise BadParamError(op, str(err)) from err
    if dy_desc.numel == 0:
        return Status.SUCCESS
    dy, dx = check_data(op, "dy", dy_desc, dy), check_data(op, "dx", dx_desc, dx)
    dx.copy_(_psamask_backward(dy, psa_type, (h_mask, w_mask), layout="NHWC"))


