"""Sparse convolution layers (spconv / mmcv interface) on top of :func:`cvops.get_indice_pairs`.

    x = cvops.sparse.SparseConvTensor(features, indices, spatial_shape, batch_size)
    net = cvops.sparse.SparseSequential(
        cvops.sparse.SubMConv3d(4, 16, 3, padding=1, indice_key="subm1"),
        torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
        cvops.sparse.SparseConv3d(16, 32, 3, stride=2, padding=1, indice_key="down1"))
    y = net(x); y.dense()  # [B, 32, D', H', W']

Weights are ``[*kernel_size, C_in, C_out]`` (mmcv layout); :mod:`cvops.sparse.weights` converts spconv
2.x checkpoints. :func:`indice_conv` is the functional gather-GEMM-scatter on a kernel map.
"""
from .functional import conv_output_size, identity_offset, indice_conv, sort_pairs_by_output
from .modules import (SparseConv2d, SparseConv3d, SparseConvolution, SparseInverseConv2d, SparseInverseConv3d,
                      SparseModule, SparseSequential, SubMConv2d, SubMConv3d, get_indice_pairs_nd)
from .tensor import IndiceData, SparseConvTensor
from .weights import convert_weight, load_state_dict

__all__ = ["IndiceData", "SparseConv2d", "SparseConv3d", "SparseConvTensor", "SparseConvolution",
           "SparseInverseConv2d", "SparseInverseConv3d", "SparseModule", "SparseSequential", "SubMConv2d",
           "SubMConv3d", "conv_output_size", "convert_weight", "get_indice_pairs_nd", "identity_offset",
           "indice_conv", "load_state_dict", "sort_pairs_by_output"]
