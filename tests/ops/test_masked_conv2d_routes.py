"""masked_conv2d's inference routes (``masked_im2col.route``) on inputs the custom ops take too: strided
masks, and autograd through the features alone (frozen weight, no bias). Both cpu paths."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cvops
import cvops.mmcv
from cvops.ops.masked_im2col import route


def _dense(x, mask, weight, bias, pad):
    return F.conv2d(x, weight, bias, padding=pad) * (mask[0] > 0)


def _strided_masks(h, w):
    """The same random mask as a transposed view, a sliced view and a contiguous tensor."""
    base = (torch.rand(1, w, h, generator=torch.Generator().manual_seed(3)) > 0.6).float()
    wide = torch.zeros(1, h, 2 * w)
    wide[..., ::2] = base.transpose(1, 2)
    return {"transposed": base.transpose(1, 2), "sliced": wide[..., ::2], "contiguous": base.transpose(1, 2).contiguous()}


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
@pytest.mark.parametrize("layout", ["transposed", "sliced", "contiguous"])
def test_a_strided_mask_gives_the_contiguous_masks_result(layout, grad, cpu_path):
    # issue 33: under no_grad a transposed mask raised "view size is not compatible with input tensor's size
    # and stride" in the route planner; with autograd it worked
    torch.manual_seed(0)
    x = torch.randn(1, 8, 12, 10, dtype=torch.float64)
    weight = torch.randn(5, 8, 3, 3, dtype=torch.float64)
    bias = torch.randn(5, dtype=torch.float64)
    mask = _strided_masks(12, 10)[layout]
    assert mask.is_contiguous() == (layout == "contiguous")
    expected = _dense(x, mask, weight, bias, 1)
    with torch.set_grad_enabled(grad):
        for fn in (cvops.masked_conv2d, cvops.mmcv.masked_conv2d):
            got = fn(x.requires_grad_(grad), mask, weight, bias, 1)
            torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-12, atol=1e-12)


def test_features_gradient_with_a_frozen_weight_and_no_bias(cpu_path):
    # only the features need a gradient: the inference routes must not be taken (a route planner that looked
    # at the weight and bias alone ran one, which raised inside index_select(out=...))
    # 12 points of a 64 x 64 map, 64 -> 8 channels: the planner's pick is the masked route on the torch path
    # and the direct one on the numba path (route.plan, fixed costs)
    torch.manual_seed(1)
    x = torch.randn(1, 64, 64, 64, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(8, 64, 3, 3, dtype=torch.float64)
    mask = (torch.rand(1, 64, 64, generator=torch.Generator().manual_seed(0)) > 0.998).double()
    with torch.no_grad():
        assert route.plan(x, mask, weight, None, 64, 64, None).route in ("masked", "direct")
    out = cvops.masked_conv2d(x, mask, weight, None, 1)
    grad = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, x, grad)
    ref = x.detach().requires_grad_()
    (want,) = torch.autograd.grad(_dense(ref, mask, weight, None, 1), ref, grad)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    module = cvops.nn.MaskedConv2d(64, 8, 3, padding=1, bias=False).double().requires_grad_(False)
    module.weight.copy_(weight)
    torch.testing.assert_close(module(x, mask).detach(), out.detach(), rtol=0, atol=0)
    assert module(x, mask).requires_grad
