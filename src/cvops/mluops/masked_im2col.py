"""masked_im2col: ``mluOpGetMaskedIm2colForwardWorkspaceSize`` and ``mluOpMaskedIm2colForward`` (NCHW feature
descriptor, int32 index descriptors, caller-allocated data_col)."""
from __future__ import annotations

from .._core.errors import Status
from .._core.validate import check_int, require
from ..ops.masked_im2col import masked_im2col as _masked_im2col
from .descriptor import DataType, Layout, check_descriptors, check_workspace, data_of, entry_point, require_each

__all__ = ["get_masked_im2col_forward_workspace_size", "masked_im2col_forward"]

_OP = "mluOpMaskedIm2colForward"


def _check(feature_desc, mask_h_idx_desc, mask_w_idx_desc, data_col_desc, kernel_h, kernel_w) -> int:
    """The MLU-OPS host checks, in their order; returns the mask count M."""
    op = _OP
    check_descriptors(op, {"feature_desc": feature_desc, "mask_h_idx_desc": mask_h_idx_desc,
                           "mask_w_idx_desc": mask_w_idx_desc, "data_col_desc": data_col_desc})
    require_each(op, {"feature": feature_desc, "data_col": data_col_desc}, dtypes=(DataType.FLOAT, DataType.HALF),
                 same_dtype=True)
    require_each(op, {"feature": feature_desc}, dim=4, layout=Layout.NCHW)
    require_each(op, {"mask_h_idx": mask_h_idx_desc, "mask_w_idx": mask_w_idx_desc}, dim=1, dtypes=(DataType.INT32,))
    require(feature_desc.shape[0] == 1, op, f"feature dims[0] (batch) must be 1, got {feature_desc.shape[0]}")
    mask_cnt = mask_h_idx_desc.shape[0]
    require(mask_cnt == mask_w_idx_desc.shape[0], op,
            f"mask_h_idx length ({mask_cnt}) must equal mask_w_idx length ({mask_w_idx_desc.shape[0]})")
    require(data_col_desc.dim == 2, op, f"data_col must be 2-D, got {data_col_desc.dim}-D")
    kernel_h = check_int(op, "kernel_h", kernel_h)
    kernel_w = check_int(op, "kernel_w", kernel_w)
    channels = feature_desc.shape[1]
    require(data_col_desc.shape[0] == channels * kernel_h * kernel_w, op,
            f"data_col dims[0] ({data_col_desc.shape[0]}) must equal channels * kernel_h * kernel_w "
            f"({channels} * {kernel_h} * {kernel_w})")
    require(data_col_desc.shape[1] == mask_cnt, op,
            f"data_col dims[1] ({data_col_desc.shape[1]}) must equal the mask count ({mask_cnt})")
    require(kernel_h > 0, op, f"kernel_h must be > 0, got {kernel_h}")
    require(kernel_w > 0, op, f"kernel_w must be > 0, got {kernel_w}")
    require(feature_desc.numel > 0 and data_col_desc.shape[0] > 0, op,
            "zero-element feature or data_col dims[0] is not supported (BAD_PARAM)")
    return mask_cnt


@entry_point("mluOpGetMaskedIm2colForwardWorkspaceSize", query=True)
def get_masked_im2col_forward_workspace_size(handle, feature_desc, mask_h_idx_desc, mask_w_idx_desc, kernel_h,
                                             kernel_w, data_col_desc) -> tuple[Status, int]:
    """``mluOpGetMaskedIm2colForwardWorkspaceSize``: returns ``(status, workspace_size)``.

    The size is the MLU-OPS one: feature bytes + data_col bytes (its NHWC staging copies); the
    transposes here need no extra space. 0 when there are no mask points or on failure.
    """
    if _check(feature_desc, mask_h_idx_desc, mask_w_idx_desc, data_col_desc, kernel_h, kernel_w) == 0:
        return 0
    return (feature_desc.numel + data_col_desc.numel) * feature_desc.itemsize


@entry_point(_OP)
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
    if _check(feature_desc, mask_h_idx_desc, mask_w_idx_desc, data_col_desc, kernel_h, kernel_w) == 0:
        return
    op = _OP
    check_workspace(op, workspace, workspace_size)
    feature, mask_h_idx, mask_w_idx, data_col = data_of(
        op, feature=(feature_desc, feature), mask_h_idx=(mask_h_idx_desc, mask_h_idx),
        mask_w_idx=(mask_w_idx_desc, mask_w_idx), data_col=(data_col_desc, data_col))
    pad = (check_int(op, "pad_h", pad_h), check_int(op, "pad_w", pad_w))
    data_col.copy_(_masked_im2col(feature, mask_h_idx, mask_w_idx, (int(kernel_h), int(kernel_w)), pad))
