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
class PSAMask(nn.Module):
    """PSANet's point-wise spatial attention mask (mmcv ``PSAMask``).

    Args:
        psa_type: ``"collect"`` or ``"distribute"``.
        mask_size: ``(h_mask, w_mask)`` or one int.

    Shape: input ``[N, h_mask*w_mask, H, W]`` -> output ``[N, H*W, H, W]``.
    """

    def __init__(self, psa_type: str, mask_size=None):
        super().__init__()
        from .ops.psamask.checks import psa_type_code
        psa_type_code(psa_type)  # reject unknown modes at construction, as mmcv does
        self.psa_type = psa_type
        self.mask_size = mask_size

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return cvops.psamask(input, self.psa_type, self.mask_size)

    def extra_repr(self) -> str:
        return f"psa_type={self.psa_type!r}, mask_size={self.mask_size}"
