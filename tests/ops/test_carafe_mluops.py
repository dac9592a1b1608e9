"""carafe: the MLU-OPS layer (cvops.mluops, mluops/carafe.py): descriptors, statuses, outputs written in place."""
from __future__ import annotations

import pytest
import torch

import cvops
from cvops import mluops
from cvops._core.errors import Status
from tests.ops.test_carafe import assert_close, inputs


def nhwc_desc(t, dtype=mluops.DataType.FLOAT, layout=mluops.Layout.NHWC):
    return mluops.create_tensor_descriptor(layout, dtype, t.shape)


def carafe_desc(k=5, g=4, s=2):
    d = mluops.create_carafe_descriptor()
    assert mluops.set_carafe_descriptor(d, 4, k, g, s) == Status.SUCCESS
    return d


def fwd_args(n=2, c=16, h=3, w=3, k=5, g=4, s=2, dtype=torch.float32):
    x, m, _ = inputs(n, c, h, w, k, g, s, "NHWC", dtype)
    y = torch.empty(n, h * s, w * s, c, dtype=dtype)
    return x, m, y


def call_fwd(handle, desc, x, m, y, **over):
    dt = mluops.DataType.HALF if x.dtype == torch.float16 else mluops.DataType.FLOAT
    args = dict(input_desc=nhwc_desc(x, dt), input=x, mask_desc=nhwc_desc(m, dt), mask=m,
                output_desc=nhwc_desc(y, dt), output=y)
    args.update(over)
    return mluops.carafe_forward(handle, desc, **args)


def call_bwd(handle, desc, x, m, gy, gx, gm, **over):
    args = dict(input_desc=nhwc_desc(x), input=x, mask_desc=nhwc_desc(m), mask=m,
                grad_output_desc=nhwc_desc(gy), grad_output=gy, grad_input_desc=nhwc_desc(gx), grad_input=gx,
                grad_mask_desc=nhwc_desc(gm), grad_mask=gm)
    args.update(over)
    return mluops.carafe_backward(handle, desc, **args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mluops_success_writes_outputs(dtype):
    h = mluops.create_handle()
    x, m, y = fwd_args(dtype=dtype)
    assert call_fwd(h, carafe_desc(), x, m, y) == Status.SUCCESS, h.last_error
    assert_close(y, cvops.carafe(x, m, 5, 4, 2, "NHWC", backend="reference"), 3e-3)
    gy = torch.randn(y.shape)
    x, m = x.float(), m.float()
    gx, gm = torch.full_like(x, float("nan")), torch.full_like(m, float("nan"))
    assert call_bwd(h, carafe_desc(), x, m, gy, gx, gm) == Status.SUCCESS, h.last_error
    ri, rm = cvops.carafe_backward(gy, x, m, 5, 4, 2, "NHWC", backend="reference")
    assert_close(gx, ri, 3e-6)
    assert_close(gm, rm, 3e-6)


def test_mluops_gtest_backward_case0():
    # input [1,3,3,2148], mask [1,9,9,25], k5 G1 s3
    h = mluops.create_handle()
    x, m, gy = inputs(1, 2148, 3, 3, 5, 1, 3, "NHWC")
    gx, gm = torch.empty_like(x), torch.empty_like(m)
    assert call_bwd(h, carafe_desc(5, 1, 3), x, m, gy, gx, gm) == Status.SUCCESS
    ri, rm = cvops.carafe_backward(gy, x, m, 5, 1, 3, "NHWC", backend="reference")
    assert_close(gx, ri, 3e-6)
    assert_close(gm, rm, 3e-6)


def test_mluops_descriptor_statuses():
    d = mluops.create_carafe_descriptor()
    assert mluops.set_carafe_descriptor(d, 4, 4, 1, 2) == Status.BAD_PARAM    # even k
    assert mluops.set_carafe_descriptor(d, 4, 0, 1, 2) == Status.BAD_PARAM
    assert mluops.set_carafe_descriptor(d, 4, 3, 0, 2) == Status.BAD_PARAM
    assert mluops.set_carafe_descriptor(d, 4, 3, 1, 0) == Status.BAD_PARAM
    assert mluops.set_carafe_descriptor(d, 5, 3, 1, 2) == Status.BAD_PARAM
    assert mluops.set_carafe_descriptor(None, 4, 3, 1, 2) == Status.BAD_PARAM
    assert mluops.set_carafe_descriptor(d, 4, 47, 1, 6) == Status.SUCCESS     # limits are checked by the ops


def test_mluops_forward_statuses():
    h = mluops.create_handle()
    x, m, y = fwd_args()
    d = carafe_desc()
    BAD, NS, OK = Status.BAD_PARAM, Status.NOT_SUPPORTED, Status.SUCCESS
    assert mluops.carafe_forward(None, d, nhwc_desc(x), x, nhwc_desc(m), m, nhwc_desc(y), y) == BAD
    assert call_fwd(h, None, x, m, y) == BAD
    assert call_fwd(h, mluops.create_carafe_descriptor(), x, m, y) == BAD      # unset descriptor
    assert call_fwd(h, d, x, m, y, input_desc=None) == BAD
    # MLU limits: k > 45 or s > 5 -> NOT_SUPPORTED (checked before any shape rule)
    d47 = mluops.create_carafe_descriptor(); mluops.set_carafe_descriptor(d47, 4, 47, 4, 2)
    assert call_fwd(h, d47, x, m, y) == NS and "45" in h.last_error
    d6 = mluops.create_carafe_descriptor(); mluops.set_carafe_descriptor(d6, 4, 5, 4, 6)
    assert call_fwd(h, d6, x, m, y) == NS
    assert call_fwd(h, d, x, m, y, input_desc=nhwc_desc(x, layout=mluops.Layout.NCHW)) == BAD
    assert call_fwd(h, d, x, m, y, mask_desc=nhwc_desc(m, dtype=mluops.DataType.DOUBLE), mask=m.double()) == BAD
    xd, md, yd = x.double(), m.double(), y.double()
    assert call_fwd(h, d, xd, md, yd, input_desc=nhwc_desc(xd, mluops.DataType.DOUBLE),
                    mask_desc=nhwc_desc(md, mluops.DataType.DOUBLE), output_desc=nhwc_desc(yd, mluops.DataType.DOUBLE)) == BAD
    y3 = y[0]
    assert call_fwd(h, d, x, m, y3, output_desc=nhwc_desc(y3)) == BAD        # 3-D
    bad_n = torch.empty(1, 6, 6, 16)
    assert call_fwd(h, d, x, m, bad_n, output_desc=nhwc_desc(bad_n)) == BAD
    bad_c = torch.empty(2, 6, 6, 12)
    assert call_fwd(h, d, x, m, bad_c, output_desc=nhwc_desc(bad_c)) == BAD
    bad_hw = torch.empty(2, 6, 5, 16)
    assert call_fwd(h, d, x, m, bad_hw, output_desc=nhwc_desc(bad_hw)) == BAD
    bad_m = torch.empty(2, 6, 6, 99)
    assert call_fwd(h, d, x, bad_m, y, mask_desc=nhwc_desc(bad_m)) == BAD
    x15 = torch.randn(2, 3, 3, 15); y15 = torch.empty(2, 6, 6, 15)
    assert call_fwd(h, d, x15, m, y15, input_desc=nhwc_desc(x15), output_desc=nhwc_desc(y15)) == BAD  # C % G
    assert "divisible" in h.last_error
    # non-contiguous data is BAD_PARAM in the forward
    xnc = torch.randn(2, 3, 16, 3).transpose(2, 3)
    assert call_fwd(h, d, xnc, m, y, input_desc=nhwc_desc(xnc)) == BAD
    assert call_fwd(h, d, x, m, y, output=None) == BAD                         # null data pointer
    # zero elements: SUCCESS, output untouched
    x0, m0, y0 = torch.randn(0, 3, 3, 16), torch.randn(0, 6, 6, 100), torch.empty(0, 6, 6, 16)
    assert call_fwd(h, d, x0, m0, y0, input_desc=nhwc_desc(x0), mask_desc=nhwc_desc(m0), output_desc=nhwc_desc(y0)) == OK
    assert call_fwd(h, d, x0, m0, y0, input_desc=nhwc_desc(x0), mask_desc=nhwc_desc(m0), output_desc=nhwc_desc(y0),
                    output=None) == OK
    assert call_fwd(h, d, x, m, y) == OK and h.last_error == ""


def test_mluops_backward_statuses():
    h = mluops.create_handle()
    x, m, _ = fwd_args()
    gy = torch.randn(2, 6, 6, 16)
    gx, gm = torch.empty_like(x), torch.empty_like(m)
    d = carafe_desc()
    BAD, NS, OK = Status.BAD_PARAM, Status.NOT_SUPPORTED, Status.SUCCESS
    assert call_bwd(h, d, x, m, gy, gx, gm, grad_mask_desc=None) == BAD
    assert call_bwd(h, d, x, m, gy, gx, gm, grad_input_desc=nhwc_desc(gx, layout=mluops.Layout.NCHW)) == BAD
    gm_bad = torch.empty(2, 6, 6, 75)
    assert call_bwd(h, d, x, m, gy, gx, gm_bad, grad_mask_desc=nhwc_desc(gm_bad)) == BAD
    gx_bad = torch.empty(2, 3, 3, 8)
    assert call_bwd(h, d, x, m, gy, gx_bad, gm, grad_input_desc=nhwc_desc(gx_bad)) == BAD
    gy_bad = torch.empty(2, 6, 4, 16)
    assert call_bwd(h, d, x, m, gy_bad, gx, gm, grad_output_desc=nhwc_desc(gy_bad)) == BAD
    gy_n = torch.empty(1, 6, 6, 16)
    assert call_bwd(h, d, x, m, gy_n, gx, gm, grad_output_desc=nhwc_desc(gy_n)) == BAD
    assert call_bwd(h, d, x, m, gy, gx, gm, grad_output_desc=nhwc_desc(gy, mluops.DataType.HALF)) == BAD
    # non-contiguous data is NOT_SUPPORTED in the backward (BAD_PARAM in the forward)
    gync = torch.randn(2, 6, 16, 6).transpose(2, 3)
    assert call_bwd(h, d, x, m, gync, gx, gm) == NS
    assert call_bwd(h, d, x, m, gy, gx, gm, grad_mask=None) == BAD                         # null data pointer
    # no scale limit in the backward; k > 137 is NOT_SUPPORTED
    d6 = carafe_desc(3, 1, 6)
    x6, m6, gy6 = inputs(1, 2, 2, 2, 3, 1, 6, "NHWC")
    gx6, gm6 = torch.empty_like(x6), torch.empty_like(m6)
    assert call_bwd(h, d6, x6, m6, gy6, gx6, gm6) == OK
    d139 = carafe_desc(139, 1, 1)
    x1, gy1 = torch.randn(1, 1, 1, 2), torch.randn(1, 1, 1, 2)
    m1 = torch.randn(1, 1, 1, 139 * 139)
    assert call_bwd(h, d139, x1, m1, gy1, torch.empty_like(x1), torch.empty_like(m1)) == NS
    d137 = carafe_desc(137, 1, 1)
    m137 = torch.randn(1, 1, 1, 137 * 137)
    gm137 = torch.empty_like(m137)
    assert call_bwd(h, d137, x1, m137, gy1, torch.empty_like(x1), gm137) == OK
    # zero elements: SUCCESS, outputs untouched
    x0, m0, gy0 = torch.randn(2, 3, 0, 16), torch.randn(2, 6, 0, 100), torch.randn(2, 6, 0, 16)
    assert call_bwd(h, d, x0, m0, gy0, torch.empty_like(x0), torch.empty_like(m0)) == OK
