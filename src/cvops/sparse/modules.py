"""Sparse convolution modules with the mmcv / spconv names and constructor signatures.

Weight layout (cvops, identical to mmcv's): ``weight [*kernel_size, in_channels, out_channels]``,
kernel offsets row-major over ``(kz, ky, kx)`` as in :func:`cvops.get_indice_pairs`. spconv 2.x stores
``[out_channels, *kernel_size, in_channels]``; :mod:`cvops.sparse.weights` converts.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._core.errors import NotSupportedError
from .._core.validate import check_int, pair, require
from .functional import _indice_conv, conv_output_size, identity_offset
from .tensor import IndiceData, SparseConvTensor


def get_indice_pairs_nd(indices, batch_size, spatial_shape, kernel_size, stride, padding, dilation, subm):
    """The layer's kernel map from :func:`cvops.get_indice_pairs` (1-D to 4-D grids)."""
    import cvops  # the kernel map lives in the get_indice_pairs operator

    return cvops.get_indice_pairs(indices, batch_size, list(spatial_shape), list(kernel_size), list(stride),
                                  list(padding), list(dilation), 0, subm=subm)


class SparseModule(nn.Module):
    """Marker base class: modules that take and return a :class:`SparseConvTensor`."""


class SparseConvolution(SparseModule):
    """Sparse (``subm=False``), submanifold (``subm=True``) or inverse (``inverse=True``) convolution.

    - sparse: output sites are every site some active input reaches; spatial shape
      ``(in + 2p - d(k-1) - 1) // s + 1``.
    - subm: output sites are the input sites; ``padding`` is used as given (the MLU-OPS contract), so
      ``padding = k // 2`` keeps the usual centred kernel.
    - inverse: runs the kernel map cached under ``indice_key`` by the matching sparse conv backwards,
      restoring that layer's input sites and spatial shape.

    ``weight [*kernel_size, in_channels, out_channels]``; ``bias [out_channels]`` is added at every
    output site.
    """

    def __init__(self, ndim: int, in_channels: int, out_channels: int, kernel_size=3, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, subm=False, output_padding=0, transposed=False,
                 inverse=False, indice_key=None):
        super().__init__()
        name = type(self).__name__
        self.ndim = ndim
        self.in_channels = check_int(name, "in_channels", in_channels, min_value=1)
        self.out_channels = check_int(name, "out_channels", out_channels, min_value=1)
        self.kernel_size = pair(name, "kernel_size", kernel_size, ndim, min_value=1)
        self.stride = pair(name, "stride", stride, ndim, min_value=1)
        self.padding = pair(name, "padding", padding, ndim, min_value=0)
        self.dilation = pair(name, "dilation", dilation, ndim, min_value=1)
        self.output_padding = pair(name, "output_padding", output_padding, ndim, min_value=0)
        if check_int(name, "groups", groups, min_value=1) != 1:
            raise NotSupportedError(name, f"groups must be 1 (as in mmcv and spconv), got {groups}")
        if transposed:
            raise NotSupportedError(name, "transposed sparse convolution is not supported "
                                          "(get_indice_pairs builds no transpose map); use SparseInverseConv")
        for s, d in zip(self.stride, self.dilation):
            require(s == 1 or d == 1, name, f"stride {self.stride} and dilation {self.dilation} cannot both be > 1")
        if subm:
            require(all(s == 1 for s in self.stride), name, f"subm needs stride 1, got {self.stride}")
        require(not (inverse and indice_key is None), name, "inverse convolution needs the indice_key of its forward conv")
        self.groups = 1
        self.subm = bool(subm)
        self.transposed = False
        self.inverse = bool(inverse)
        self.indice_key = indice_key
        self.weight = nn.Parameter(torch.empty(*self.kernel_size, self.in_channels, self.out_channels))
        self.bias = nn.Parameter(torch.empty(self.out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # kaiming_uniform(a=sqrt(5)) with fan_in = in_channels * prod(kernel_size), as torch.nn.Conv3d
        bound = 1.0 / math.sqrt(self.in_channels * math.prod(self.kernel_size))
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
             f"padding={self.padding}, dilation={self.dilation}")
        if self.subm:
            s += ", subm=True"
        if self.inverse:
            s += ", inverse=True"
        if self.bias is None:
            s += ", bias=False"
        if self.indice_key is not None:
            s += f", indice_key={self.indice_key!r}"
        return s

    def _kernel_map(self, x: SparseConvTensor) -> IndiceData:
        name = type(self).__name__
        data = x.find_indice_pair(self.indice_key)
        if self.inverse:
            require(data is not None, name, f"no kernel map cached under indice_key={self.indice_key!r}; "
                    "the matching SparseConv must run first on this tensor's ancestors")
            require(not data.subm, name, f"indice_key={self.indice_key!r} holds a subm map; inverse needs a sparse conv's")
            require(tuple(data.kernel_size) == self.kernel_size, name,
                    f"kernel_size {self.kernel_size} must equal the forward conv's {tuple(data.kernel_size)}")
            require(data.out_indices.shape[0] == x.indices.shape[0], name,
                    f"input has {x.indices.shape[0]} sites but the forward conv produced {data.out_indices.shape[0]}")
            return data
        if data is not None:
            require(data.indices.shape[0] == x.indices.shape[0] and data.spatial_shape == x.spatial_shape
                    and tuple(data.kernel_size) == self.kernel_size and data.subm == self.subm, name,
                    f"indice_key={self.indice_key!r} is cached for another input or layer geometry "
                    f"({data.indices.shape[0]} sites, spatial {data.spatial_shape}, kernel {tuple(data.kernel_size)}, "
                    f"subm={data.subm}); give this layer its own key")
            return data
        if self.subm:
            out_spatial = list(x.spatial_shape)
        else:
            out_spatial = conv_output_size(x.spatial_shape, self.kernel_size, self.stride, self.padding, self.dilation)
            require(all(s >= 1 for s in out_spatial), name,
                    f"output spatial shape {out_spatial} is empty for input {x.spatial_shape}")
        out_indices, pairs, num = get_indice_pairs_nd(x.indices, x.batch_size, x.spatial_shape, self.kernel_size,
                                                      self.stride, self.padding, self.dilation, self.subm)
        data = IndiceData(out_indices, x.indices, pairs, num, list(x.spatial_shape), out_spatial,
                          self.kernel_size, self.subm)
        if self.indice_key is not None:
            x.indice_dict[self.indice_key] = data
        return data

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        name = type(self).__name__
        require(isinstance(x, SparseConvTensor), name, f"input must be a SparseConvTensor, got {type(x).__name__}")
        require(x.ndim == self.ndim, name, f"input is {x.ndim}-D, the layer {self.ndim}-D")
        require(x.features.shape[1] == self.in_channels, name,
                f"input has {x.features.shape[1]} channels, the layer expects {self.in_channels}")
        require(x.features.shape[0] == x.indices.shape[0], name,
                f"input features rows ({x.features.shape[0]}) must equal its indices rows ({x.indices.shape[0]}) "
                "(were .features reassigned?)")
        data = self._kernel_map(x)
        map_rows = (data.out_indices if self.inverse else data.indices).shape[0]
        require(x.features.shape[0] == map_rows, name,
                f"input features rows ({x.features.shape[0]}) must equal the kernel map's input sites ({map_rows})")
        if self.inverse:
            out_indices, out_spatial, ident = data.indices, data.spatial_shape, -1
        else:
            out_indices, out_spatial = data.out_indices, data.out_spatial_shape
            ident = identity_offset(self.kernel_size, self.padding, self.dilation) if self.subm else -1
        features = _indice_conv(x.features, self.weight, data.indice_pairs, data.indice_num, out_indices.shape[0],
                                inverse=self.inverse, identity_offset=ident,
                                indice_pairs_by_output=data.pairs_sorted_by_output(), backend=None,
                                check_values=False)  # the map comes from get_indice_pairs on these sites
        if self.bias is not None:
            features = features + self.bias
        out = SparseConvTensor(features, out_indices, out_spatial, x.batch_size, x.grid)
        out.indice_dict = x.indice_dict
        return out


def _layer(ndim: int, subm: bool, doc: str):
    class _Conv(SparseConvolution):
        def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                     bias=True, indice_key=None):
            super().__init__(ndim, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                             bias, subm=subm, indice_key=indice_key)

    _Conv.__doc__ = doc
    return _Conv


SparseConv2d = _layer(2, False, "2-D sparse convolution ``(in_channels, out_channels, kernel_size, stride=1, "
                                "padding=0, dilation=1, groups=1, bias=True, indice_key=None)``.")
SparseConv3d = _layer(3, False, "3-D sparse convolution ``(in_channels, out_channels, kernel_size, stride=1, "
                                "padding=0, dilation=1, groups=1, bias=True, indice_key=None)``.")
SubMConv2d = _layer(2, True, "2-D submanifold convolution: output sites = input sites (padding as given).")
SubMConv3d = _layer(3, True, "3-D submanifold convolution: output sites = input sites (padding as given).")
for _cls, _name in ((SparseConv2d, "SparseConv2d"), (SparseConv3d, "SparseConv3d"), (SubMConv2d, "SubMConv2d"),
                    (SubMConv3d, "SubMConv3d")):
    _cls.__name__ = _cls.__qualname__ = _name


class SparseInverseConv2d(SparseConvolution):
    """Inverse of the 2-D :class:`SparseConv2d` cached under ``indice_key`` (restores its input sites)."""

    def __init__(self, in_channels, out_channels, kernel_size, indice_key=None, bias=True):
        super().__init__(2, in_channels, out_channels, kernel_size, bias=bias, inverse=True, indice_key=indice_key)


class SparseInverseConv3d(SparseConvolution):
    """Inverse of the :class:`SparseConv3d` cached under ``indice_key`` (restores its input sites)."""

    def __init__(self, in_channels, out_channels, kernel_size, indice_key=None, bias=True):
        super().__init__(3, in_channels, out_channels, kernel_size, bias=bias, inverse=True, indice_key=indice_key)


class SparseSequential(SparseModule, nn.Sequential):
    """``nn.Sequential`` for sparse tensors: sparse modules get the tensor, any other module (BatchNorm1d,
    ReLU, ...) is applied to its ``features``."""

    def forward(self, x):
        for module in self:
            if isinstance(module, SparseModule):
                x = module(x)
            elif isinstance(x, SparseConvTensor):
                x = x.replace_feature(module(x.features))
            else:
                x = module(x)
        return x
