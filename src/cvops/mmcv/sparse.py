"""mmcv.ops' sparse convolution classes on cvops: mmcv's names, signatures and weight layout
``[*kernel_size, in_channels, out_channels]``, sharing :mod:`cvops.sparse`'s implementation.

``SparseConvTensor``, ``SparseModule`` and ``SparseSequential`` are cvops.sparse's (mmcv's have the same
interface; ``features`` may be reassigned). SubM layers centre the kernel and ignore padding, as mmcv's do.
A spconv 2.x checkpoint loads through ``cvops.sparse.load_state_dict(model, state_dict, "spconv")``.
"""
from __future__ import annotations

from ..sparse import SparseConvTensor, SparseMaxPool, SparseModule, SparseSequential
from ..sparse import SparseConvolution as _SparseConvolution
from ..sparse.layers import conv_classes
from ..sparse.pool import _pool_class


class SparseConvolution(_SparseConvolution):
    """:class:`cvops.sparse.SparseConvolution` with mmcv's weight layout ``[*kernel, in, out]``."""

    WEIGHT_LAYOUT = "mmcv"


_CONV = conv_classes(SparseConvolution, inverse_key_required=False, ndims=(2, 3, 4))
SparseConv2d, SparseConv3d, SparseConv4d = _CONV["SparseConv2d"], _CONV["SparseConv3d"], _CONV["SparseConv4d"]
SubMConv2d, SubMConv3d, SubMConv4d = _CONV["SubMConv2d"], _CONV["SubMConv3d"], _CONV["SubMConv4d"]
SparseConvTranspose2d, SparseConvTranspose3d = _CONV["SparseConvTranspose2d"], _CONV["SparseConvTranspose3d"]
SparseInverseConv2d, SparseInverseConv3d = _CONV["SparseInverseConv2d"], _CONV["SparseInverseConv3d"]
for _cls in _CONV.values():
    _cls.__module__ = __name__
del _CONV["SparseConvTranspose4d"], _CONV["SparseInverseConv4d"]  # mmcv has neither
SparseMaxPool2d, SparseMaxPool3d = _pool_class(SparseMaxPool, 2), _pool_class(SparseMaxPool, 3)

__all__ = ["SparseConv2d", "SparseConv3d", "SparseConv4d", "SparseConvTensor", "SparseConvTranspose2d",
           "SparseConvTranspose3d", "SparseConvolution", "SparseInverseConv2d", "SparseInverseConv3d", "SparseMaxPool",
           "SparseMaxPool2d", "SparseMaxPool3d", "SparseModule", "SparseSequential", "SubMConv2d", "SubMConv3d",
           "SubMConv4d"]
