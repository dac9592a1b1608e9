"""spconv.pytorch.ops: output-size helpers, the kernel map and ``ConvAlgo``.

``get_indice_pairs`` returns cvops's map (``indice_pairs [K, 2, L]``, ``indice_num [K]``; spconv's native
map is ``[2, K, L]``) and takes spconv's argument order; ``algo`` is accepted and ignored. With
``subm=True`` it centres the kernel (padding ignored), as spconv's does.
"""
from enum import Enum

from .._core.validate import pair
from ..ops.get_indice_pairs import get_conv_output_size, get_deconv_output_size
from ..sparse.modules import centred_padding, get_indice_pairs_nd


class ConvAlgo(Enum):
    """spconv's algorithm choice; cvops runs one algorithm whatever is chosen."""

    Native = 0
    MaskImplicitGemm = 1
    MaskSplitImplicitGemm = 2


def get_indice_pairs(indices, batch_size, spatial_shape, algo, ksize, stride, padding, dilation, out_padding,
                     subm=False, transpose=False, num_out_act_bound=-1):
    """``(out_indices, indice_pairs [K, 2, L], indice_num [K])`` with spconv's argument order; each of ``ksize``,
    ``stride``, ``padding``, ``dilation`` and ``out_padding`` is an int or one int per spatial dimension."""
    n = len(spatial_shape)
    op = "get_indice_pairs"
    ksize, stride, padding, dilation, out_padding = (
        pair(op, name, value, n) for name, value in (("ksize", ksize), ("stride", stride), ("padding", padding),
                                                     ("dilation", dilation), ("out_padding", out_padding)))
    if subm:
        padding = centred_padding(ksize, dilation)
    return get_indice_pairs_nd(indices, batch_size, spatial_shape, ksize, stride, padding, dilation, subm,
                               transpose, out_padding)


__all__ = ["ConvAlgo", "get_conv_output_size", "get_deconv_output_size", "get_indice_pairs"]
