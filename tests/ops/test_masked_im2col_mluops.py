"""masked_im2col: the MLU-OPS layer (cvops.mluops, mluops/masked_im2col.py): workspace query, statuses, data_col written in place."""
from __future__ import annotations

import pytest
import torch

from cvops import mluops
from cvops.mluops.descriptor import from_torch_dtype
from cvops._core.errors import Status
from cvops.metrics import bit_equal
from tests.ops.test_masked_im2col import ref_im2col


def _mlu_args(c=4, hgt=5, wid=6, m=3, kh=3, kw=3, dtype=torch.float32, idx=torch.int32):
    feature = torch.randn(1, c, hgt, wid).to(dtype)
    h = torch.tensor([0, 2, -3, 4, 9, 1][:m], dtype=idx)
    w = torch.tensor([1, -1, 3, 5, 0, 7][:m], dtype=idx)
    data_col = torch.full((c * kh * kw, m), 7.0, dtype=dtype)
    feature_desc = mluops.create_tensor_descriptor(mluops.Layout.NCHW, from_torch_dtype(dtype), feature.shape)
    return dict(feature_desc=feature_desc,
                feature=feature, mask_h_idx_desc=mluops.descriptor_of(h), mask_h_idx=h,
                mask_w_idx_desc=mluops.descriptor_of(w), mask_w_idx=w, kernel_h=kh, kernel_w=kw, pad_h=1, pad_w=1,
                workspace=None, workspace_size=0, data_col_desc=mluops.descriptor_of(data_col), data_col=data_col)


def _call(handle, a):
    return mluops.masked_im2col_forward(handle, a["feature_desc"], a["feature"], a["mask_h_idx_desc"], a["mask_h_idx"],
                                        a["mask_w_idx_desc"], a["mask_w_idx"], a["kernel_h"], a["kernel_w"],
                                        a["pad_h"], a["pad_w"], a["workspace"], a["workspace_size"],
                                        a["data_col_desc"], a["data_col"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mluops_forward_success(dtype):
    handle = mluops.create_handle()
    a = _mlu_args(dtype=dtype)
    assert _call(handle, a) == Status.SUCCESS and handle.last_error == ""
    assert bit_equal(a["data_col"], ref_im2col(a["feature"], a["mask_h_idx"], a["mask_w_idx"], (3, 3), (1, 1)))
    status, size = mluops.get_masked_im2col_forward_workspace_size(
        handle, a["feature_desc"], a["mask_h_idx_desc"], a["mask_w_idx_desc"], 3, 3, a["data_col_desc"])
    assert status == Status.SUCCESS
    assert size == (a["feature"].numel() + a["data_col"].numel()) * a["feature"].element_size()


def _desc(layout, dtype, shape):
    return mluops.create_tensor_descriptor(layout, dtype, shape)


F32, I32 = mluops.DataType.FLOAT, mluops.DataType.INT32
BAD = [
    ("null feature_desc", dict(feature_desc=None)),
    ("NHWC feature", dict(feature_desc=_desc(mluops.Layout.NHWC, F32, (1, 4, 5, 6)))),
    ("3-D feature", dict(feature_desc=_desc(mluops.Layout.NCHW, F32, (4, 5, 6)))),
    ("double feature", dict(feature_desc=_desc(mluops.Layout.NCHW, mluops.DataType.DOUBLE, (1, 4, 5, 6)))),
    ("feature/data_col dtype", dict(data_col_desc=_desc(mluops.Layout.ARRAY, mluops.DataType.HALF, (36, 3)))),
    ("int64 mask_h_idx", dict(mask_h_idx_desc=_desc(mluops.Layout.ARRAY, mluops.DataType.INT64, (3,)))),
    ("int64 mask_w_idx", dict(mask_w_idx_desc=_desc(mluops.Layout.ARRAY, mluops.DataType.INT64, (3,)))),
    ("batch 2", dict(feature_desc=_desc(mluops.Layout.NCHW, F32, (2, 4, 5, 6)))),
    ("2-D mask idx", dict(mask_h_idx_desc=_desc(mluops.Layout.ARRAY, I32, (3, 1)))),
    ("mask lengths", dict(mask_w_idx_desc=_desc(mluops.Layout.ARRAY, I32, (4,)))),
    ("3-D data_col", dict(data_col_desc=_desc(mluops.Layout.ARRAY, F32, (36, 3, 1)))),
    ("data_col dim0", dict(data_col_desc=_desc(mluops.Layout.ARRAY, F32, (35, 3)))),
    ("data_col dim1", dict(data_col_desc=_desc(mluops.Layout.ARRAY, F32, (36, 4)))),
    ("kernel_h 0", dict(kernel_h=0, data_col_desc=_desc(mluops.Layout.ARRAY, F32, (0, 3)))),
    ("kernel_w negative", dict(kernel_w=-3, data_col_desc=_desc(mluops.Layout.ARRAY, F32, (-36, 3)))),
    ("empty feature", dict(feature_desc=_desc(mluops.Layout.NCHW, F32, (1, 0, 5, 6)),
                           data_col_desc=_desc(mluops.Layout.ARRAY, F32, (0, 3)))),
    ("empty spatial feature", dict(feature_desc=_desc(mluops.Layout.NCHW, F32, (1, 4, 0, 6)))),
    ("null workspace with size", dict(workspace_size=16)),
    ("null feature", dict(feature=None)),
    ("null mask_h_idx", dict(mask_h_idx=None)),
    ("null data_col", dict(data_col=None)),
    ("feature shape vs desc", dict(feature=torch.randn(1, 4, 5, 7))),
    ("int64 data vs int32 desc", dict(mask_w_idx=torch.tensor([1, 2, 3]))),
]


@pytest.mark.parametrize("name, change", BAD, ids=[b[0] for b in BAD])
def test_mluops_bad_param(name, change):
    handle = mluops.create_handle()
    a = _mlu_args()
    a.update(change)
    before = a["data_col"].clone() if isinstance(a["data_col"], torch.Tensor) else None
    assert _call(handle, a) == Status.BAD_PARAM
    assert handle.last_error
    if before is not None:
        assert torch.equal(a["data_col"], before)  # nothing written


def test_mluops_null_handle_and_large_tensor():
    a = _mlu_args()
    assert _call(None, a) == Status.BAD_PARAM
    handle = mluops.create_handle()
    a["feature_desc"] = _desc(mluops.Layout.NCHW, F32, (1, 2**16, 2**8, 2**7))  # 2^31 elements, never allocated
    a["data_col_desc"] = _desc(mluops.Layout.ARRAY, F32, (2**16 * 9, 3))
    assert _call(handle, a) == Status.NOT_SUPPORTED


def test_mluops_zero_mask_points_is_success_without_writing():
    handle = mluops.create_handle()
    a = _mlu_args(m=0)
    assert _call(handle, a) == Status.SUCCESS
    status, size = mluops.get_masked_im2col_forward_workspace_size(
        handle, a["feature_desc"], a["mask_h_idx_desc"], a["mask_w_idx_desc"], 3, 3, a["data_col_desc"])
    assert (status, size) == (Status.SUCCESS, 0)
    # empty feature is checked before M == 0
    a["feature_desc"] = _desc(mluops.Layout.NCHW, F32, (1, 4, 0, 6))
    assert _call(handle, a) == Status.BAD_PARAM


def test_mluops_workspace_query_bad_param():
    handle = mluops.create_handle()
    a = _mlu_args()
    status, size = mluops.get_masked_im2col_forward_workspace_size(
        handle, a["feature_desc"], a["mask_h_idx_desc"], a["mask_w_idx_desc"], 3, 2, a["data_col_desc"])
    assert (status, size) == (Status.BAD_PARAM, 0)
