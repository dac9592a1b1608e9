"""``mmcv.ops.carafe``: the CARAFE modules and functions under mmcv's module path (mmdet's CARAFE-FPN neck
and CARAFE mask head import ``from mmcv.ops.carafe import CARAFEPack``)."""
from __future__ import annotations

from torch import Tensor

from cvops import nn as _nn  # absolute: the file also imports as mmcv.ops.<name>
from cvops._core.errors import asserts_like_mmcv
from cvops.ops.carafe import carafe_forward as _carafe

CARAFE = _nn.CARAFE
CARAFENaive = _nn.CARAFENaive
CARAFEPack = _nn.CARAFEPack


@asserts_like_mmcv
def carafe(features: Tensor, masks: Tensor, kernel_size: int, group_size: int, scale_factor: int) -> Tensor:
    """mmcv ``carafe``: ``features [N, C, H, W]``, ``masks [N, G*k*k, sH, sW]`` -> ``[N, C, sH, sW]``;
    mask channel ``(g*k + ky)*k + kx``, zero padding outside the feature. Differentiable."""
    return _carafe(features, masks, kernel_size, group_size, scale_factor)


carafe_naive = carafe  # mmcv's naive and optimised kernels compute the same function

__all__ = ["CARAFE", "CARAFENaive", "CARAFEPack", "carafe", "carafe_naive"]
