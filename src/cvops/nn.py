"""``torch.nn`` modules with mmcv/torchvision names and signatures."""
from __future__ import annotations

import torch
from torch import nn

import cvops


class MaskedConv2d(nn.Conv2d):
    """mmcv's ``MaskedConv2d``: a ``Conv2d`` evaluated only where ``mask > 0``, trainable here.

    ``forward(input, mask=None)``: without a mask it is the plain ``Conv2d``; with ``mask [1, H, W]``
    (``input [1, C, H, W]``) the output ``[1, O, H + 2p - kh + 1, W + 2p - kw + 1]`` holds
    ``bias + W * window`` at the mask points and exact zeros elsewhere (mmcv adds no bias there).
    The masked path needs stride, dilation and groups of 1 and has a backward for input, weight
    and bias (mmcv's has none).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)

    def forward(self, input, mask=None):
        if mask is None:
            return super().forward(input)
        return cvops.masked_conv2d(input, mask, self.weight, self.bias, self.padding, self.stride,
                                   self.dilation, self.groups)
