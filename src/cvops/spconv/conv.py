"""spconv.pytorch.conv: the convolution classes (1-D to 4-D; sparse, SubM, transposed, inverse).

``SparseConvolution`` is :class:`cvops.sparse.SparseConvolution` itself (OpenPCDet's
``find_all_spconv_keys`` tests ``isinstance(m, spconv.conv.SparseConvolution)``).
"""
from ..sparse import _CONV, SparseConvolution

globals().update(_CONV)
__all__ = ["SparseConvolution", *_CONV]
