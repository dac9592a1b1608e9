"""cvops.mmcv's DeformConv2d and nms / batched_nms against oracles written here: the deformable convolution as
loops (bilinear sampling per kernel tap, the formula of torchvision's test oracle), NMS as a plain Python loop.
torchvision's kernels do not load beside the CPU torch build of CI, so the plain torch routes run there."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cvops.mmcv as mm
from cvops import BadParamError
from cvops.mmcv.deform_conv import deform_conv2d_torch
from cvops.mmcv.nms import nms_torch


def bilinear(plane: np.ndarray, y: float, x: float) -> float:
    """``plane`` sampled at ``(y, x)``: 0 outside ``(-1, H) x (-1, W)``, corners outside the plane count 0."""
    h, w = plane.shape
    if not (-1 < y < h and -1 < x < w):
        return 0.0
    y0, x0 = math.floor(y), math.floor(x)
    total = 0.0
    for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            if 0 <= yy < h and 0 <= xx < w:
                total += wy * wx * plane[yy, xx]
    return total


def deform_conv_loops(x, offset, weight, stride, padding, dilation) -> np.ndarray:
    """Every output element as a sum over its input channels and kernel taps of weight * sampled input."""
    x, offset, weight = (t.detach().double().numpy() for t in (x, offset, weight))
    n, c, _, _ = x.shape
    out_channels, per_group, kh, kw = weight.shape
    _, offset_channels, oh, ow = offset.shape
    per_deform_group = c // (offset_channels // (2 * kh * kw))
    out = np.zeros((n, out_channels, oh, ow))
    for b, o, i, j in np.ndindex(n, out_channels, oh, ow):
        group = o // (out_channels // (c // per_group))
        for ci in range(per_group):
            channel = group * per_group + ci
            for ky, kx in np.ndindex(kh, kw):
                pair = 2 * ((channel // per_deform_group) * kh * kw + ky * kw + kx)
                y = i * stride[0] - padding[0] + ky * dilation[0] + offset[b, pair, i, j]
                xx = j * stride[1] - padding[1] + kx * dilation[1] + offset[b, pair + 1, i, j]
                out[b, o, i, j] += weight[o, ci, ky, kx] * bilinear(x[b, channel], y, xx)
    return out


def _deform_case(seed=0, n=2, c=4, out=4, kernel=(2, 3), hw=(5, 6), stride=(2, 1), padding=(1, 2), dilation=(2, 1),
                 groups=2, deform_groups=2, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    kh, kw = kernel
    oh = (hw[0] + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (hw[1] + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    x = torch.randn(n, c, *hw, generator=g, dtype=torch.float64)
    offset = scale * torch.randn(n, deform_groups * 2 * kh * kw, oh, ow, generator=g, dtype=torch.float64)
    weight = torch.randn(out, c // groups, kh, kw, generator=g, dtype=torch.float64)
    return x, offset, weight, dict(stride=stride, padding=padding, dilation=dilation, groups=groups,
                                   deform_groups=deform_groups)


def test_deform_conv2d_matches_the_loop_oracle():
    """Non-square kernel, stride, padding and dilation per axis, groups and deformable groups; offsets send
    samples outside the input on every side."""
    x, offset, weight, args = _deform_case()
    expected = deform_conv_loops(x, offset, weight, args["stride"], args["padding"], args["dilation"])
    plain = deform_conv2d_torch(x, offset, weight, args["stride"], args["padding"], args["dilation"],
                                args["groups"], args["deform_groups"])
    np.testing.assert_allclose(plain.numpy(), expected, rtol=1e-12, atol=1e-12)
    public = mm.deform_conv2d(x, offset, weight, **args)  # torchvision's kernel where it loads
    np.testing.assert_allclose(public.numpy(), expected, rtol=1e-10, atol=1e-10)


def test_deform_conv2d_module_float32_and_zero_offsets():
    x, offset, weight, _ = _deform_case(seed=1, c=6, out=4, kernel=(3, 3), hw=(7, 7), stride=(1, 1), padding=(1, 1),
                                        dilation=(1, 1), groups=1, deform_groups=3)
    layer = mm.DeformConv2d(6, 4, 3, padding=1, deform_groups=3).double()
    layer.weight.data.copy_(weight)
    expected = deform_conv_loops(x, offset, weight, (1, 1), (1, 1), (1, 1))
    single = mm.DeformConv2d(6, 4, 3, padding=1, deform_groups=3)
    single.weight.data.copy_(weight)
    np.testing.assert_allclose(single(x.float(), offset.float()).detach().numpy(), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer(x, offset).detach().numpy(), expected, rtol=1e-10, atol=1e-10)
    # with zero offsets the deformable convolution is the plain one, and DeformConv2dPack starts there
    assert torch.allclose(layer(x, torch.zeros_like(offset)), F.conv2d(x, weight, padding=1), atol=1e-12)
    pack = mm.DeformConv2dPack(6, 4, 3, stride=2, padding=1, groups=2).double()
    assert torch.allclose(pack(x), F.conv2d(x, pack.weight, stride=2, padding=1, groups=2), atol=1e-12)


def test_deform_conv2d_backward_gradcheck():
    """The plain route's gradients (input, offset, weight: autograd on its torch ops) against finite differences."""
    x, offset, weight, args = _deform_case(seed=2, n=1, c=2, out=2, kernel=(2, 2), hw=(4, 4), stride=(1, 1),
                                           padding=(1, 0), dilation=(1, 1), groups=1, deform_groups=1, scale=0.7)
    pairs = (args["stride"], args["padding"], args["dilation"], 1, 1)
    inputs = tuple(t.requires_grad_() for t in (x, offset, weight))
    assert torch.autograd.gradcheck(lambda a, b, c: deform_conv2d_torch(a, b, c, *pairs), inputs)


def test_deform_conv2d_rejects_bad_arguments():
    x, offset, weight, args = _deform_case()
    with pytest.raises(BadParamError, match="offset must have shape"):
        mm.deform_conv2d(x, offset[:, :-2], weight, **args)
    with pytest.raises(BadParamError, match="bias must be False"):
        mm.deform_conv2d(x, offset, weight, **args, bias=True)
    with pytest.raises(BadParamError, match="bias must be False"):
        mm.DeformConv2d(4, 4, 3, bias=True)
    with pytest.raises(BadParamError, match="deform_groups"):
        mm.DeformConv2d(4, 4, 3, deform_groups=3)
    assert mm.DeformConv2d(4, 4, 3, deformable_groups=2).deform_groups == 2  # mmcv 1.x's name


def test_deform_conv2d_errors_are_the_assertion_errors_mmcv_raises():
    """mmcv's own test_deform_conv expects AssertionError for these (bias, groups, the batch against
    im2col_step); each is also cvops's BadParamError."""
    for make in (lambda: mm.DeformConv2d(1, 1, 2, bias=True), lambda: mm.DeformConv2d(3, 2, 3, groups=2),
                 lambda: mm.DeformConv2d(3, 4, 3, groups=3)):
        with pytest.raises(AssertionError) as caught:
            make()
        assert isinstance(caught.value, BadParamError)
    x, offset, weight, args = _deform_case()
    batch = torch.cat([x] * 10), torch.cat([offset] * 10)
    with pytest.raises(AssertionError, match="batch size must be divisible by im2col_step"):
        mm.deform_conv2d(*batch, weight, **args, im2col_step=3)
    torch.testing.assert_close(mm.deform_conv2d(*batch, weight, **args, im2col_step=5)[:2],
                               mm.deform_conv2d(x, offset, weight, **args, im2col_step=2))  # min(step, N) divides N


# ---------------------------------------------------------------------------------------------------- nms

def iou(a, b, offset=0) -> float:
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + offset)
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + offset)
    inter = width * height
    area = lambda box: (box[2] - box[0] + offset) * (box[3] - box[1] + offset)  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def loop_nms(boxes, scores, threshold, offset=0) -> list:
    """Greedy NMS: in descending score order, keep a box unless it overlaps a kept one by more than threshold."""
    boxes, scores = boxes.tolist(), scores.tolist()
    keep = []
    for i in sorted(range(len(scores)), key=lambda i: -scores[i]):
        if all(iou(boxes[i], boxes[k], offset) <= threshold for k in keep):
            keep.append(i)
    return keep


def random_boxes(n, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    corner = torch.rand(n, 2, generator=g, dtype=dtype) * 60
    boxes = torch.cat([corner, corner + 4 + torch.rand(n, 2, generator=g, dtype=dtype) * 30], 1)
    return boxes, torch.rand(n, generator=g, dtype=dtype), torch.randint(0, 4, (n,), generator=g)


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
def test_nms_matches_loop(threshold):
    boxes, scores, _ = random_boxes(120, seed=int(threshold * 10))
    expected = loop_nms(boxes, scores, threshold)
    dets, inds = mm.nms(boxes, scores, threshold)
    assert inds.tolist() == expected
    assert torch.equal(dets, torch.cat([boxes[inds], scores[inds, None]], 1))
    assert nms_torch(boxes, scores, threshold).tolist() == expected
    assert nms_torch(boxes, scores, threshold, offset=1).tolist() == loop_nms(boxes, scores, threshold, offset=1)


def test_nms_options_and_numpy():
    boxes, scores, _ = random_boxes(80, seed=5)
    candidates = torch.nonzero(scores > 0.4).view(-1)  # dropped before the suppression
    expected = [candidates[i].item() for i in loop_nms(boxes[candidates], scores[candidates], 0.5)]
    assert mm.nms(boxes, scores, 0.5, score_threshold=0.4)[1].tolist() == expected
    assert mm.nms(boxes, scores, 0.5, max_num=5)[1].tolist() == loop_nms(boxes, scores, 0.5)[:5]
    dets, inds = mm.nms(boxes.float().numpy(), scores.float().numpy(), 0.5)
    assert isinstance(dets, np.ndarray) and dets.shape == (len(inds), 5) and inds.dtype == np.int64
    empty_dets, empty_inds = mm.nms(boxes[:0], scores[:0], 0.5)
    assert empty_dets.shape == (0, 5) and empty_inds.numel() == 0
    with pytest.raises(BadParamError, match=r"boxes must be \[N, 4\]"):
        mm.nms(boxes[:, :3], scores, 0.5)


def test_batched_nms_matches_a_loop_per_class():
    boxes, scores, classes = random_boxes(200, seed=7)
    expected = [i for c in range(4) for i in (torch.nonzero(classes == c).view(-1)[k].item()
                                              for k in loop_nms(boxes[classes == c], scores[classes == c], 0.5))]
    expected.sort(key=lambda i: -scores[i].item())
    dets, keep = mm.batched_nms(boxes, scores, classes, dict(type="nms", iou_threshold=0.5))
    assert keep.tolist() == expected
    assert torch.equal(dets, torch.cat([boxes[keep], scores[keep, None]], 1))
    agnostic = mm.batched_nms(boxes, scores, classes, dict(iou_threshold=0.5, class_agnostic=True))[1]
    assert agnostic.tolist() == loop_nms(boxes, scores, 0.5)
    assert mm.batched_nms(boxes, scores, classes, dict(iou_threshold=0.5, max_num=10))[1].tolist() == expected[:10]
    unsuppressed = mm.batched_nms(boxes, scores, classes, None)[1]
    assert unsuppressed.tolist() == sorted(range(200), key=lambda i: -scores[i].item())
    with pytest.raises(NotImplementedError, match="soft_nms"):
        mm.batched_nms(boxes, scores, classes, dict(type="soft_nms", iou_threshold=0.5))
