"""``mmcv.ops.deform_conv``: ``DeformConv2d``, ``DeformConv2dPack`` (mmcv's ``'DCN'``) and ``deform_conv2d``,
with mmcv's signatures (mmdet's GA-RetinaNet ``FeatureAdaption`` calls ``DeformConv2d``).

Each kernel tap samples the input bilinearly at its position moved by its offset (channels
``(g*kh*kw + tap)*2 + (0: dy, 1: dx)``; zero outside ``(-1, H) x (-1, W)`` and at corners off the image).
torchvision's kernels run where they load, otherwise :func:`deform_conv2d_torch` (plain torch, autograd).
"""
from __future__ import annotations

import functools
from typing import Union

import torch
from torch import Tensor, nn

# absolute imports: the file also loads as mmcv.ops.<name> where cvops.mmcv stands in for mmcv.ops
from cvops._core.errors import asserts_like_mmcv
from cvops._core.validate import FLOAT_DTYPES, check_int, check_same_device, check_tensor, pair, require
from cvops.mmcv._torchvision import torchvision_ops

_OP = "deform_conv2d"
IntPair = Union[int, tuple]


@asserts_like_mmcv
def deform_conv2d(input: Tensor, offset: Tensor, weight: Tensor, stride: IntPair = 1, padding: IntPair = 0,
                  dilation: IntPair = 1, groups: int = 1, deform_groups: int = 1, bias: bool = False,
                  im2col_step: int = 32) -> Tensor:
    """mmcv ``deform_conv2d``: ``input [N, C, H, W]``, ``offset [N, deform_groups*2*kh*kw, Ho, Wo]``, ``weight
    [O, C/groups, kh, kw]`` -> ``[N, O, Ho, Wo]``. ``bias`` must be False and the batch a multiple of
    ``min(im2col_step, N)``, as in mmcv (where the step sizes its CUDA batches; here it changes nothing else).
    Differentiable in input, offset and weight."""
    stride, padding, dilation, groups, deform_groups = _check(input, offset, weight, stride, padding, dilation,
                                                              groups, deform_groups)
    require(bias is False, _OP, f"bias must be False (mmcv's DeformConv2d has no bias), got {bias!r}")
    step = min(check_int(_OP, "im2col_step", im2col_step, min_value=1), input.shape[0])
    require(step == 0 or input.shape[0] % step == 0, _OP,  # mmcv's rule, though the result would not depend on it
            f"batch size must be divisible by im2col_step: {input.shape[0]} % {step} != 0")
    tv = torchvision_ops()
    if tv is not None:
        return tv.deform_conv2d(input, offset, weight, None, stride, padding, dilation)
    return deform_conv2d_torch(input, offset, weight, stride, padding, dilation, groups, deform_groups)


def deform_conv2d_torch(input: Tensor, offset: Tensor, weight: Tensor, stride: tuple, padding: tuple,
                        dilation: tuple, groups: int, deform_groups: int) -> Tensor:
    """The plain torch route of :func:`deform_conv2d` (checked arguments; tuples for the pairs)."""
    n, c, _, _ = input.shape
    out_channels, _, kh, kw = weight.shape
    oh, ow = offset.shape[-2:]
    columns = _sample(input, offset, (kh, kw), stride, padding, dilation, deform_groups)  # [N, C, taps, L]
    columns = columns.reshape(n, groups, (c // groups) * kh * kw, oh * ow)
    out = torch.matmul(weight.reshape(groups, out_channels // groups, -1), columns)  # [N, groups, O/groups, L]
    return out.reshape(n, out_channels, oh, ow)


def _sample(x: Tensor, offset: Tensor, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple,
            deform_groups: int) -> Tensor:
    """``[N, C, kh*kw, Ho*Wo]``: each channel bilinearly sampled at every tap of every output position."""
    n, c, h, w = x.shape
    (kh, kw), (oh, ow) = kernel, offset.shape[-2:]
    taps = kh * kw
    shift = offset.reshape(n, deform_groups, taps, 2, oh, ow)
    arange = dict(device=x.device, dtype=offset.dtype)
    tap_y = (torch.arange(kh, **arange) * dilation[0]).repeat_interleave(kw).view(taps, 1, 1)
    tap_x = (torch.arange(kw, **arange) * dilation[1]).repeat(kh).view(taps, 1, 1)
    row = (torch.arange(oh, **arange) * stride[0] - padding[0]).view(oh, 1)
    col = (torch.arange(ow, **arange) * stride[1] - padding[1]).view(1, ow)
    y = row + tap_y + shift[:, :, :, 0]  # [N, G, taps, Ho, Wo]
    xs = col + tap_x + shift[:, :, :, 1]
    inside = (y > -1) & (y < h) & (xs > -1) & (xs < w)
    y0, x0 = y.floor(), xs.floor()
    fy, fx = y - y0, xs - x0  # the bilinear weights' fractions; their gradient is the offset's
    y0, x0 = y0.long(), x0.long()
    planes = x.reshape(n, deform_groups, c // deform_groups, h * w)
    columns = None
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            yy, xx = y0 + dy, x0 + dx
            valid = inside & (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            index = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).reshape(n, deform_groups, 1, taps * oh * ow)
            values = planes.gather(3, index.expand(-1, -1, c // deform_groups, -1))
            term = values * (wy * wx * valid).reshape(n, deform_groups, 1, taps * oh * ow).to(values.dtype)
            columns = term if columns is None else columns + term
    return columns.reshape(n, c, taps, oh * ow)


def _check(input, offset, weight, stride, padding, dilation, groups, deform_groups):
    for name, t in (("input", input), ("offset", offset), ("weight", weight)):
        check_tensor(_OP, name, t, dim=4, dtypes=FLOAT_DTYPES)
    check_same_device(_OP, input=input, offset=offset, weight=weight)
    stride = pair(_OP, "stride", stride, min_value=1)
    padding = pair(_OP, "padding", padding, min_value=0)
    dilation = pair(_OP, "dilation", dilation, min_value=1)
    groups = check_int(_OP, "groups", groups, min_value=1)
    deform_groups = check_int(_OP, "deform_groups", deform_groups, min_value=1)
    n, c, h, w = input.shape
    out_channels, per_group, kh, kw = weight.shape
    require( c % groups == 0 and out_channels % groups == 0, _OP,
            f"groups ({groups}) must divide input channels ({c}) and weight's output channels ({out_channels})")
    require(per_group * groups == c, _OP, f"weight's dim 1 ({per_group}) must be input channels / groups "
            f"({c} / {groups})")
    require(c % deform_groups == 0, _OP,
            f"deform_groups ({deform_groups}) must divide input channels ({c})")
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    require(oh > 0 and ow > 0, _OP, f"the output would be empty ({oh} x {ow}): input {h} x {w} is smaller than "
            f"the dilated kernel {kh} x {kw} with padding {padding}")
    expected = (n, deform_groups * 2 * kh * kw, oh, ow)
    require(tuple(offset.shape) == expected, _OP,
            f"offset must have shape [N, deform_groups*2*kh*kw, Ho, Wo] = {list(expected)}, "
            f"got {list(offset.shape)}")
    require(input.dtype == offset.dtype == weight.dtype, _OP, f"input, offset and weight must share one dtype, "
            f"got {input.dtype}, {offset.dtype}, {weight.dtype}")
    return stride, padding, dilation, groups, deform_groups


def _renamed_deformable_groups(init):
    """Accept mmcv 1.x's ``deformable_groups`` for ``deform_groups``, as mmcv 2.x still does."""
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        if "deformable_groups" in kwargs:
            require("deform_groups" not in kwargs, type(self).__name__,
                    "give deform_groups or its old name deformable_groups, not both")
            kwargs["deform_groups"] = kwargs.pop("deformable_groups")
        init(self, *args, **kwargs)
    return wrapper


class DeformConv2d(nn.Module):
    """mmcv ``DeformConv2d``: ``forward(x [N, C, H, W], offset) -> [N, O, Ho, Wo]``, weight ``[O, C/groups, kh,
    kw]`` (kaiming-uniform), no bias (``bias=True`` is an error, as in mmcv). ``deformable_groups`` is
    accepted for ``deform_groups``, as mmcv accepts it."""

    @asserts_like_mmcv
    @_renamed_deformable_groups
    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntPair, stride: IntPair = 1,
                 padding: IntPair = 0, dilation: IntPair = 1, groups: int = 1, deform_groups: int = 1,
                 bias: bool = False, im2col_step: int = 32):
        super().__init__()
        op = type(self).__name__
        require(not bias, op, f"bias must be False (mmcv's DeformConv2d has no bias), got {bias!r}")
        in_channels = check_int(op, "in_channels", in_channels, min_value=1)
        out_channels = check_int(op, "out_channels", out_channels, min_value=1)
        groups = check_int(op, "groups", groups, min_value=1)
        deform_groups = check_int(op, "deform_groups", deform_groups, min_value=1)
        require(in_channels % groups == 0 and out_channels % groups == 0, op,
                f"groups ({groups}) must divide in_channels ({in_channels}) and out_channels ({out_channels})")
        require(in_channels % deform_groups == 0, op,
                f"deform_groups ({deform_groups}) must divide in_channels ({in_channels})")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = pair(op, "kernel_size", kernel_size, min_value=1)
        self.stride = pair(op, "stride", stride, min_value=1)
        self.padding = pair(op, "padding", padding, min_value=0)
        self.dilation = pair(op, "dilation", dilation, min_value=1)
        self.groups, self.deform_groups, self.im2col_step = groups, deform_groups, im2col_step
        self.transposed, self.output_padding = False, (0,)  # read by code that treats it as an nn.Conv2d
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, nonlinearity="relu")

    def forward(self, x: Tensor, offset: Tensor) -> Tensor:
        return deform_conv2d(x, offset, self.weight, self.stride, self.padding, self.dilation, self.groups,
                             self.deform_groups, False, self.im2col_step)

    def extra_repr(self) -> str:
        return (f"in_channels={self.in_channels}, out_channels={self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"deform_groups={self.deform_groups}, bias=False")


class DeformConv2dPack(DeformConv2d):
    """mmcv ``DeformConv2dPack`` (registered as ``'DCN'``): a :class:`DeformConv2d` whose offsets come from its
    own convolution ``conv_offset`` (same kernel, stride, padding and dilation; zero-initialised, so it starts
    as a plain convolution). ``forward(x) -> [N, O, Ho, Wo]``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        kh, kw = self.kernel_size
        self.conv_offset = nn.Conv2d(self.in_channels, self.deform_groups * 2 * kh * kw, self.kernel_size,
                                     self.stride, self.padding, self.dilation, bias=True)
        self.init_offset()

    def init_offset(self) -> None:
        nn.init.zeros_(self.conv_offset.weight)
        nn.init.zeros_(self.conv_offset.bias)

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return super().forward(x, self.conv_offset(x))


__all__ = ["DeformConv2d", "DeformConv2dPack", "deform_conv2d"]
