"""psamask: ``mluOpPsamaskForward`` and ``mluOpPsamaskBackward`` on NHWC float descriptors and
caller-allocated outputs."""
from __future__ import annotations

import torch

from .._core.errors import BadParamError
from .._core.validate import check_int, require
from ..ops.psamask import psamask_backward as _psamask_backward, psamask_forward as _psamask_forward
from ..ops.psamask.checks import psa_type_code
from .descriptor import DataType, Layout, check_data, check_descriptors, entry_point, require_each

__all__ = ["psamask_backward", "psamask_forward"]


def _check(op, psa_type, in_desc, out_desc, h_mask, w_mask) -> bool:
    """``checkParams`` of kernels/psamask: in = x (dx), out = y (dy); True when there is nothing to do.

    Every failure is BAD_PARAM, the 2^31-element limit included. MLU-OPS also fails with NOT_SUPPORTED
    when one row does not fit its on-chip NRAM (``findLimit``); that limit belongs to the MLU, and cvops
    handles any channel count. Unlike MLU-OPS, an unknown ``psa_type`` is BAD_PARAM rather than a silent
    no-op (decisions.md).
    """
    try:
        psa_type_code(psa_type)
        h_mask = check_int(op, "h_mask", h_mask, min_value=1)
        w_mask = check_int(op, "w_mask", w_mask, min_value=1)
        descs = {"input desc": in_desc, "output desc": out_desc}
        check_descriptors(op, descs)
    except NotImplementedError as err:  # the caller remaps every checkParams failure to BAD_PARAM
        raise BadParamError(op, str(err)) from err
    require_each(op, descs, dim=4, layout=Layout.NHWC, dtypes=(DataType.FLOAT,))
    require(in_desc.shape[:3] == out_desc.shape[:3], op,
            f"N, H, W of input {in_desc.shape[:3]} and output {out_desc.shape[:3]} must match")
    require(h_mask * w_mask == in_desc.shape[3], op,
            f"input channels ({in_desc.shape[3]}) must equal h_mask * w_mask ({h_mask * w_mask})")
    require(out_desc.shape[1] * out_desc.shape[2] == out_desc.shape[3], op,
            f"output channels ({out_desc.shape[3]}) must equal h_feature * w_feature")
    return in_desc.numel == 0


@entry_point("mluOpPsamaskForward")
def psamask_forward(handle, psa_type, x_desc, x, h_mask, w_mask, y_desc, y):
    """``mluOpPsamaskForward``: x ``[N, H, W, h_mask*w_mask]`` NHWC float -> y ``[N, H, W, H*W]``."""
    op = "mluOpPsamaskForward"
    if not _check(op, psa_type, x_desc, y_desc, h_mask, w_mask):
        x, y = check_data(op, "x", x_desc, x), check_data(op, "y", y_desc, y)
        with torch.no_grad():  # the kernel writes y itself (y overlapping x is BAD_PARAM)
            _psamask_forward(x, psa_type, (h_mask, w_mask), layout="NHWC", out=y)


@entry_point("mluOpPsamaskBackward")
def psamask_backward(handle, psa_type, dy_desc, dy, h_mask, w_mask, dx_desc, dx):
    """``mluOpPsamaskBackward``: dy ``[N, H, W, H*W]`` NHWC float -> dx ``[N, H, W, h_mask*w_mask]``."""
    op = "mluOpPsamaskBackward"
    if not _check(op, psa_type, dx_desc, dy_desc, h_mask, w_mask):
        dy, dx = check_data(op, "dy", dy_desc, dy), check_data(op, "dx", dx_desc, dx)
        with torch.no_grad():
            _psamask_backward(dy, psa_type, (h_mask, w_mask), layout="NHWC", out=dx)
