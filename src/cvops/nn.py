"""``torch.nn`` modules with mmcv/torchvision names and signatures."""
from __future__ import annotations

import torch
from torch import nn

import cvops


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
