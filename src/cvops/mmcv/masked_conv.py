"""``mmcv.ops.masked_conv``: ``MaskedConv2d`` and ``masked_conv2d`` under mmcv's module path (mmdet's
GA-RetinaNet head uses them)."""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from cvops import nn as _nn  # absolute: the file also imports as mmcv.ops.<name>
from cvops._core.errors import asserts_like_mmcv
from cvops.ops.masked_im2col import masked_conv2d as _masked_conv2d

MaskedConv2d = _nn.MaskedConv2d


@asserts_like_mmcv
def masked_conv2d(features: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], padding=0,
                  stride=1) -> Tensor:
    """mmcv ``masked_conv2d``: ``features [1, C, H, W]``, ``mask [1, H, W]`` -> ``[1, O, H + 2p - kh + 1,
    W + 2p - kw + 1]`` holding ``bias + W * window`` where ``mask > 0`` and zeros elsewhere.
    ``stride`` other than 1 is a ``ValueError``, as in mmcv."""
    return _masked_conv2d(features, mask, weight, bias, padding, stride)


__all__ = ["MaskedConv2d", "masked_conv2d"]
