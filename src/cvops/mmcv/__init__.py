"""``mmcv.ops`` names, signatures, defaults, return types and numerics, on cvops's implementation.

Migrating is one import::

    from mmcv.ops import CARAFEPack, MaskedConv2d, PSAMask     # before
    from cvops.mmcv import CARAFEPack, MaskedConv2d, PSAMask    # after

State dicts load unchanged (same parameter names and shapes). What differs from mmcv 2.x, on purpose:

- everything runs on the CPU too (mmcv's CARAFE is CUDA-only) and every backward is deterministic;
- ``MaskedConv2d``/``masked_conv2d`` have a backward (input, weight, bias; mmcv returns no gradients) and
  accept ``bias=None``;
- a bad argument raises :class:`cvops.BadParamError` (a ``ValueError``) naming the rule where mmcv
  asserts; a masked ``MaskedConv2d`` with stride, dilation or groups other than 1 raises where mmcv
  silently computes the stride-1, undilated convolution;
- ``PSAMask`` also accepts ``psa_type`` 0/1 (mmcv's enum values).

The sparse convolution classes (:mod:`cvops.mmcv.sparse`) keep mmcv's weight layout ``[*kernel, in, out]``.

The modules are :mod:`cvops.nn`'s (mmcv's signatures), so they also work under ``torch.jit.script``,
``torch.fx``, ``torch.export`` and ``torch.compile``.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .. import nn as _nn
from ..ops.carafe import carafe_forward as _carafe
from ..ops.masked_im2col import masked_conv2d as _masked_conv2d
from .sparse import (SparseConv2d, SparseConv3d, SparseConvolution, SparseConvTensor, SparseConvTranspose2d,
                     SparseConvTranspose3d, SparseInverseConv2d, SparseInverseConv3d, SparseMaxPool2d,
                     SparseMaxPool3d, SparseModule, SparseSequential, SubMConv2d, SubMConv3d)

CARAFE = _nn.CARAFE
CARAFENaive = _nn.CARAFENaive
CARAFEPack = _nn.CARAFEPack
MaskedConv2d = _nn.MaskedConv2d


class PSAMask(_nn.PSAMask):
    """mmcv ``PSAMask(psa_type, mask_size=None)``: ``[N, h_mask*w_mask, H, W] -> [N, H*W, H, W]``.

    ``psa_type_enum`` (0 collect, 1 distribute) and the ``repr`` are mmcv's.
    """

    def __init__(self, psa_type: str, mask_size: Optional[tuple] = None):
        super().__init__(psa_type, mask_size)
        self.psa_type_enum = self.psa_code

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(psa_type={self.psa_type}, mask_size={self.mask_size})"


def carafe(features: Tensor, masks: Tensor, kernel_size: int, group_size: int, scale_factor: int) -> Tensor:
    """mmcv ``carafe``: ``features [N, C, H, W]``, ``masks [N, G*k*k, sH, sW]`` -> ``[N, C, sH, sW]``;
    mask channel ``(g*k + ky)*k + kx``, zero padding outside the feature. Differentiable."""
    return _carafe(features, masks, kernel_size, group_size, scale_factor)


def carafe_naive(features: Tensor, masks: Tensor, kernel_size: int, group_size: int, scale_factor: int) -> Tensor:
    """mmcv ``carafe_naive``: the same function as :func:`carafe` (mmcv's two kernels differ only in speed)."""
    return _carafe(features, masks, kernel_size, group_size, scale_factor)


def masked_conv2d(features: Tensor, mask: Tensor, weight: Tensor, bias: Optional[Tensor], padding=0,
                  stride=1) -> Tensor:
    """mmcv ``masked_conv2d``: ``features [1, C, H, W]``, ``mask [1, H, W]`` -> ``[1, O, H + 2p - kh + 1,
    W + 2p - kw + 1]`` holding ``bias + W * window`` where ``mask > 0`` and zeros elsewhere.
    ``stride`` other than 1 is a ``ValueError``, as in mmcv."""
    return _masked_conv2d(features, mask, weight, bias, padding, stride)


__all__ = ["CARAFE", "CARAFENaive", "CARAFEPack", "MaskedConv2d", "PSAMask", "SparseConv2d", "SparseConv3d",
           "SparseConvTensor", "SparseConvTranspose2d", "SparseConvTranspose3d", "SparseConvolution",
           "SparseInverseConv2d", "SparseInverseConv3d", "SparseMaxPool2d", "SparseMaxPool3d", "SparseModule",
           "SparseSequential", "SubMConv2d", "SubMConv3d", "carafe", "carafe_naive", "masked_conv2d"]
