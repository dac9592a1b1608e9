"""Sparse convolution layers (spconv 2.x interface and weight layout) on top of :func:`cvops.get_indice_pairs`.

    x = cvops.sparse.SparseConvTensor(features, indices, spatial_shape, batch_size)
    net = cvops.sparse.SparseSequential(
        cvops.sparse.SubMConv3d(4, 16, 3, indice_key="subm1"),
        torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
        cvops.sparse.SparseConv3d(16, 32, 3, stride=2, padding=1, indice_key="down1"))
    y = net(x); y.dense()  # [B, 32, D', H', W']

Weights are spconv 2.x's ``[out, *kernel_size, in]``; ``cvops.mmcv``'s classes keep mmcv's
``[*kernel_size, in, out]``; :func:`load_state_dict` loads a checkpoint of either (or torch's) layout.
SubM layers centre the kernel and ignore padding (spconv, mmcv); :func:`indice_conv` is the functional
gather-GEMM-scatter on a kernel map. ``cvops.spconv`` is this package under spconv.pytorch's module paths.
"""
from .functional import indice_conv
from .kmap import conv_output_size, identity_offset, sort_pairs_by_output
from .layers import conv_classes
from .modules import (RemoveGrid, SparseBatchNorm, SparseConvolution, SparseIdentity, SparseModule, SparseReLU,
                      SparseSequential, ToDense, centred_padding, get_indice_pairs_nd)
from .pool import (SparseAvgPool, SparseAvgPool1d, SparseAvgPool2d, SparseAvgPool3d, SparseGlobalAvgPool,
                   SparseGlobalMaxPool, SparseMaxPool, SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d,
                   SparseMaxPool4d)
from .tensor import IndiceData, SparseConvTensor
from .weights import convert_weight, load_state_dict

_CONV = conv_classes(SparseConvolution)
globals().update(_CONV)

__all__ = sorted(["IndiceData", "RemoveGrid", "SparseAvgPool", "SparseAvgPool1d", "SparseAvgPool2d",
                  "SparseAvgPool3d", "SparseBatchNorm", "SparseConvTensor", "SparseConvolution",
                  "SparseGlobalAvgPool", "SparseGlobalMaxPool", "SparseIdentity", "SparseMaxPool", "SparseMaxPool1d",
                  "SparseMaxPool2d", "SparseMaxPool3d", "SparseMaxPool4d", "SparseModule", "SparseReLU",
                  "SparseSequential", "ToDense", "centred_padding", "conv_output_size", "convert_weight",
                  "get_indice_pairs_nd", "identity_offset", "indice_conv", "load_state_dict", "sort_pairs_by_output",
                  *_CONV])
