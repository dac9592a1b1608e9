"""``mmcv.ops.psa_mask``: ``PSAMask`` and the function ``psa_mask`` under mmcv's module path."""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from cvops import nn as _nn  # absolute: the file also imports as mmcv.ops.<name>
from cvops._core.errors import asserts_like_mmcv
from cvops.ops.psamask import psamask as _psamask


class PSAMask(_nn.PSAMask):
    """mmcv ``PSAMask(psa_type, mask_size=None)``: ``[N, h_mask*w_mask, H, W] -> [N, H*W, H, W]``.

    ``psa_type_enum`` (0 collect, 1 distribute) and the ``repr`` are mmcv's.
    """

    def __init__(self, psa_type: str, mask_size: Optional[tuple] = None):
        super().__init__(psa_type, mask_size)
        self.psa_type_enum = self.psa_code

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(psa_type={self.psa_type}, mask_size={self.mask_size})"


@asserts_like_mmcv
def psa_mask(input: Tensor, psa_type, mask_size) -> Tensor:
    """mmcv ``psa_mask`` (its autograd function's ``apply``): ``psa_type`` 0 (collect) or 1 (distribute), as
    ``PSAMask`` passes it, or the name; ``mask_size`` an int or ``(h_mask, w_mask)``. Differentiable."""
    return _psamask(input, psa_type, mask_size)


__all__ = ["PSAMask", "psa_mask"]
