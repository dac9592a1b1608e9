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

The names also sit at mmcv's module paths: :mod:`cvops.mmcv.carafe`, :mod:`cvops.mmcv.masked_conv`,
:mod:`cvops.mmcv.psa_mask` (which also has mmcv's function ``psa_mask``). The sparse convolution classes
(:mod:`cvops.mmcv.sparse`) keep mmcv's weight layout ``[*kernel, in, out]``.

The modules are :mod:`cvops.nn`'s (mmcv's signatures), so they also work under ``torch.jit.script``,
``torch.fx``, ``torch.export`` and ``torch.compile``.
"""
from __future__ import annotations

from .carafe import CARAFE, CARAFENaive, CARAFEPack, carafe, carafe_naive
from .masked_conv import MaskedConv2d, masked_conv2d
from .psa_mask import PSAMask
from .sparse import (SparseConv2d, SparseConv3d, SparseConvolution, SparseConvTensor, SparseConvTranspose2d,
                     SparseConvTranspose3d, SparseInverseConv2d, SparseInverseConv3d, SparseMaxPool2d,
                     SparseMaxPool3d, SparseModule, SparseSequential, SubMConv2d, SubMConv3d)

__all__ = ["CARAFE", "CARAFENaive", "CARAFEPack", "MaskedConv2d", "PSAMask", "SparseConv2d", "SparseConv3d",
           "SparseConvTensor", "SparseConvTranspose2d", "SparseConvTranspose3d", "SparseConvolution",
           "SparseInverseConv2d", "SparseInverseConv3d", "SparseMaxPool2d", "SparseMaxPool3d", "SparseModule",
           "SparseSequential", "SubMConv2d", "SubMConv3d", "carafe", "carafe_naive", "masked_conv2d"]
