"""spconv.pytorch.functional: convolution and pooling on a kernel map, and ``sparse_add``.

The maps are cvops's (``indice_pairs [K, 2, L]`` as :mod:`cvops.spconv.ops` and the layers' ``indice_dict``
hold them); filters are spconv 2.x's ``[out, *kernel, in]``. ``algo``, ``timer`` and the fused-activation
arguments are accepted and ignored; ``bias`` is added when given.
"""
import math

import torch

from .._core.validate import require
from ..sparse.functional import indice_conv as _conv
from ..sparse.pool import _reduce, valid_pairs
from ..sparse.tensor import SparseConvTensor


def _kernel_matrices(filters: torch.Tensor) -> torch.Tensor:
    out_c, in_c = filters.shape[0], filters.shape[-1]
    return filters.reshape(out_c, math.prod(filters.shape[1:-1]), in_c).permute(1, 2, 0)


def indice_conv(features, filters, indice_pairs, indice_pair_num, num_activate_out, algo=None, timer=None,
                bias=None, act_alpha=0.0, act_beta=0.0, act_type=None):
    out = _conv(features, _kernel_matrices(filters), indice_pairs, indice_pair_num, num_activate_out)
    return out if bias is None else out + bias


indice_subm_conv = indice_conv  # the map decides what a convolution is; spconv's signatures are the same


def indice_inverse_conv(features, filters, indice_pairs, indice_pair_num, num_activate_out, algo=None, timer=None,
                        bias=None, act_alpha=0.0, act_beta=0.0, act_type=None):
    out = _conv(features, _kernel_matrices(filters), indice_pairs, indice_pair_num, num_activate_out, inverse=True)
    return out if bias is None else out + bias


def _pool(features, indice_pairs, indice_pair_num, num_activate_out, how):
    src, dst = valid_pairs(indice_pairs, indice_pair_num)
    if src.numel():
        require(int(src.min()) >= 0 and int(src.max()) < features.shape[0] and int(dst.min()) >= 0
                and int(dst.max()) < num_activate_out, "indice_maxpool", "indice_pairs rows out of range")
    return _reduce(features, src, dst, num_activate_out, how)


def indice_maxpool(features, indice_pairs, indice_pair_num, num_activate_out):
    return _pool(features, indice_pairs, indice_pair_num, num_activate_out, "amax")


def indice_avgpool(features, indice_pairs, indice_pair_num, num_activate_out):
    return _pool(features, indice_pairs, indice_pair_num, num_activate_out, "mean")


def sparse_add(*tens: SparseConvTensor) -> SparseConvTensor:
    """Sum of sparse tensors on the same grid: the union of their sites, features added where sites meet."""
    require(len(tens) >= 1, "sparse_add", "needs at least one tensor")
    first = tens[0]
    for t in tens[1:]:
        require(t.spatial_shape == first.spatial_shape and t.batch_size == first.batch_size
                and t.features.shape[1] == first.features.shape[1], "sparse_add",
                "tensors must share spatial_shape, batch_size and channels")
    indices = torch.cat([t.indices for t in tens])
    features = torch.cat([t.features for t in tens])
    sites, rows = torch.unique(indices, dim=0, return_inverse=True)
    out = features.new_zeros(sites.shape[0], features.shape[1]).index_add(0, rows, features)
    return SparseConvTensor(out, sites.to(torch.int32), first.spatial_shape, first.batch_size)


sparse_add_hash_based = sparse_add

__all__ = ["indice_avgpool", "indice_conv", "indice_inverse_conv", "indice_maxpool", "indice_subm_conv",
           "sparse_add", "sparse_add_hash_based"]
