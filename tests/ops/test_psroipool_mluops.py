"""psroipool: the MLU-OPS layer (cvops.mluops, mluops/psroipool.py): descriptors, statuses, outputs written in place."""
from __future__ import annotations

import pytest
import torch

import cvops
from cvops import mluops
from cvops._core.errors import Status
from tests.ops.test_psroipool import assert_close


NHWC, ARRAY = mluops.Layout.NHWC, mluops.Layout.ARRAY
FLOAT, INT32 = mluops.DataType.FLOAT, mluops.DataType.INT32


def _forward_call(n=2, h=5, w=6, ph=3, pw=3, group=3, od=2, scale=1.0, rois=None, in_layout=NHWC,
                  in_dtype=FLOAT, map_dtype=INT32, out_shape=None, map_shape=None, with_data=True,
                  workspace=None, workspace_size=0):
    handle = mluops.create_handle()
    x = torch.randn(n, h, w, ph * pw * od)
    rois = torch.tensor([[0.0, 0, 0, 4, 4], [n - 1, 1, 1, 5, 3]]) if rois is None else rois
    out = torch.zeros(out_shape or (rois.shape[0], ph, pw, od))
    mapping = torch.zeros(map_shape or out.shape, dtype=torch.int32)
    d = mluops.create_tensor_descriptor
    status = mluops.psroipool_forward(
        handle, ph, pw, scale, group, od, d(in_layout, in_dtype, x.shape), x if with_data else None,
        d(ARRAY, FLOAT, rois.shape), rois, workspace, workspace_size, d(NHWC, FLOAT, out.shape), out,
        d(NHWC, map_dtype, mapping.shape), mapping)
    return status, handle, x, rois, out, mapping


def test_mluops_forward_success_writes_outputs():
    status, _, x, rois, out, mapping = _forward_call()
    assert status == Status.SUCCESS
    ref, ref_map = cvops.psroi_pool(x, rois, 3, 3, 1.0, 3, 2, "NHWC", backend="reference")
    assert_close(out, ref)
    assert torch.equal(mapping, ref_map)
    assert mluops.get_psroipool_workspace_size(mluops.create_handle(), 2) == (Status.SUCCESS, 8)
    assert mluops.get_psroipool_workspace_size(mluops.create_handle(), 0)[0] == Status.BAD_PARAM
    assert mluops.get_psroipool_workspace_size(None, 2)[0] == Status.BAD_PARAM


@pytest.mark.parametrize("kwargs,status,match", [
    (dict(in_layout=mluops.Layout.NCHW), Status.BAD_PARAM, "layout must be NHWC"),
    (dict(in_dtype=mluops.DataType.HALF), Status.BAD_PARAM, "dtype must be FLOAT"),
    (dict(map_dtype=mluops.DataType.INT64), Status.BAD_PARAM, "dtype must be INT32"),
    (dict(pw=2, group=3), Status.BAD_PARAM, "pooled_width"),
    (dict(ph=2, pw=2, group=3), Status.BAD_PARAM, "group_size"),
    (dict(scale=0.0), Status.BAD_PARAM, "spatial_scale"),
    (dict(rois=torch.zeros(2, 4)), Status.BAD_PARAM, r"rois must be \[R, 5\]"),
    (dict(rois=torch.zeros(0, 5)), Status.BAD_PARAM, "zero-element"),
    (dict(out_shape=(2, 3, 3, 3)), Status.BAD_PARAM, "output_dim"),
    (dict(map_shape=(2, 3, 3, 1)), Status.BAD_PARAM, "mapping_channel shape"),
    (dict(out_shape=(3, 3, 3, 2), map_shape=(3, 3, 3, 2)), Status.BAD_PARAM, "rois count"),
    (dict(with_data=False), Status.BAD_PARAM, "input is null"),
    (dict(workspace_size=8), Status.BAD_PARAM, "workspace is null"),
    (dict(rois=torch.tensor([[5.0, 0, 0, 3, 3], [0, 0, 0, 3, 3]])), Status.BAD_PARAM, "batch index"),
    (dict(n=0, with_data=False), Status.SUCCESS, ""),               # empty input: SUCCESS before pointers
    (dict(n=0, rois=torch.zeros(0, 5), with_data=False), Status.SUCCESS, ""),  # ... and before empty rois
])
def test_mluops_forward_statuses(kwargs, status, match):
    got, handle, *_ = _forward_call(**kwargs)
    assert got == status, handle.last_error
    assert match in handle.last_error or re_search(match, handle.last_error)


def re_search(pattern, text):
    import re
    return re.search(pattern, text) is not None


def _backward_call(n=2, h=5, w=6, p=3, od=2, scale=1.0, rois=None, top_shape=None, bottom_c=None, with_data=True,
                   map_shape=None, top_dtype=FLOAT, ph_arg=None):
    handle = mluops.create_handle()
    rois = torch.tensor([[0.0, 0, 0, 4, 4], [n - 1 if n else 0, 1, 1, 5, 3]]) if rois is None else rois
    top = torch.randn(top_shape or (rois.shape[0], p, p, od))
    chan = torch.arange(od * p * p, dtype=torch.int32).view(od, p, p).permute(1, 2, 0)
    mapping = chan.expand(top.shape).contiguous() if map_shape is None else torch.zeros(map_shape, dtype=torch.int32)
    bottom = torch.full((n, h, w, bottom_c or p * p * od), 7.0)
    d = mluops.create_tensor_descriptor
    status = mluops.psroipool_backward(
        handle, ph_arg or p, p, scale, od, d(NHWC, top_dtype, top.shape), top if with_data else None,
        d(ARRAY, FLOAT, rois.shape), rois, d(NHWC, INT32, mapping.shape), mapping, d(NHWC, FLOAT, bottom.shape),
        bottom)
    return status, handle, top, rois, mapping, bottom


def test_mluops_backward_success_overwrites_bottom_grad():
    status, _, top, rois, mapping, bottom = _backward_call()
    assert status == Status.SUCCESS
    ref = cvops.psroi_pool_backward(top, rois, mapping, 1.0, 2, tuple(bottom.shape), "NHWC", backend="reference")
    assert_close(bottom, ref)


@pytest.mark.parametrize("kwargs,status,match", [
    (dict(top_dtype=mluops.DataType.HALF), Status.BAD_PARAM, "dtype must be FLOAT"),
    (dict(ph_arg=2), Status.BAD_PARAM, "pooled_height"),
    (dict(top_shape=(2, 3, 2, 2), map_shape=(2, 3, 2, 2)), Status.BAD_PARAM, "pooled_width"),
    (dict(bottom_c=17), Status.BAD_PARAM, "bottom_grad channels"),
    (dict(map_shape=(2, 3, 3, 1)), Status.BAD_PARAM, "mapping_channel shape"),
    (dict(scale=-1.0), Status.BAD_PARAM, "spatial_scale"),
    (dict(with_data=False), Status.BAD_PARAM, "top_grad is null"),
    (dict(rois=torch.zeros(0, 5), top_shape=(0, 3, 3, 2)), Status.BAD_PARAM, "zero-element"),
    (dict(n=0, with_data=False), Status.SUCCESS, ""),
])
def test_mluops_backward_statuses(kwargs, status, match):
    got, handle, *_ = _backward_call(**kwargs)
    assert got == status, handle.last_error
    assert match in handle.last_error


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_mluops_tensors_of_2_31_bytes_are_not_supported(direction):
    # MLU-OPS's large-tensor limit is NOT_SUPPORTED (as for get_indice_pairs and masked_im2col), not BAD_PARAM;
    # the descriptors are consistent and describe 2^31 or more bytes, never allocated
    handle = mluops.create_handle()
    d = mluops.create_tensor_descriptor
    rois = torch.tensor([[0.0, 0, 0, 4, 4]])
    pooled = d(NHWC, FLOAT, (1, 3, 3, 64))
    for h, w, status in ((1024, 1024, Status.NOT_SUPPORTED),   # 1024 * 1024 * 576 * 4 bytes >= 2^31
                         (512, 1024, Status.BAD_PARAM)):       # below: on to the null-pointer check
        big = d(NHWC, FLOAT, (1, h, w, 9 * 64))
        if direction == "forward":
            got = mluops.psroipool_forward(handle, 3, 3, 1.0, 3, 64, big, None, d(ARRAY, FLOAT, rois.shape), rois,
                                           None, 0, pooled, None, d(NHWC, INT32, (1, 3, 3, 64)), None)
        else:
            got = mluops.psroipool_backward(handle, 3, 3, 1.0, 64, pooled, None, d(ARRAY, FLOAT, rois.shape), rois,
                                            d(NHWC, INT32, (1, 3, 3, 64)), None, big, None)
        assert got == status, handle.last_error
        assert ("2^31 or more bytes" in handle.last_error) == (status == Status.NOT_SUPPORTED)
