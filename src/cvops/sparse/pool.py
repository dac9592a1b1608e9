"""Sparse pooling on a kernel map (spconv 2.x's ``SparseMaxPool*``, ``SparseAvgPool*``) and global pooling.

- max pool: ``out[o] = max`` of the active inputs the kernel reaches at ``o`` (inactive sites do not take
  part, they are not zeros); the gradient goes to the maximal input (split evenly between exact ties).
  (spconv 2.3.8's CPU max pool starts from 0 instead, so it gives 0 where every input is negative.)
- avg pool: the mean over those active inputs ("real point count", as spconv's, not the kernel volume).
- global pools: per sample, the max / mean over its active sites, a dense ``[batch_size, C]``; a sample
  without sites gives zeros. (spconv 2.3.8's ``SparseGlobalAvgPool`` returns only the first channel of
  each mean, ``[B]``; cvops returns the whole ``[B, C]`` mean.)

Output sites, spatial shape and the kernel-map cache follow the convolution with the same geometry
(``subm=True``: the input sites, kernel centred). ``stride=None`` means ``stride = kernel_size``.
"""
from __future__ import annotations

import torch

from .._core.validate import pair, require
from .modules import SparseModule, check_input, kernel_map
from .tensor import SparseConvTensor


def _pairs(data, n_in: int):
    """All valid ``(input row, output row)`` pairs of a kernel map, as two int64 vectors."""
    K, _, L = data.indice_pairs.shape
    valid = torch.arange(L) < data.indice_num.cpu().long()[:, None]
    pairs = data.indice_pairs.to(torch.int64)
    return pairs[:, 0][valid.to(pairs.device)], pairs[:, 1][valid.to(pairs.device)]


def _reduce(features: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_out: int, how: str):
    rows = features.index_select(0, src)
    out = features.new_zeros(num_out, features.shape[1])
    return out.scatter_reduce(0, dst[:, None].expand(-1, features.shape[1]), rows, how, include_self=False)


class _SparsePool(SparseModule):
    REDUCE = "amax"

    def __init__(self, ndim, kernel_size=3, stride=1, padding=0, dilation=1, indice_key=None, subm=False,
                 algo=None, record_voxel_count=False, name=None):
        super().__init__(name=name)
        cls = type(self).__name__
        self.ndim = ndim
        self.kernel_size = pair(cls, "kernel_size", kernel_size, ndim, min_value=1)
        self.stride = self.kernel_size if stride is None else pair(cls, "stride", stride, ndim, min_value=1)
        self.padding = pair(cls, "padding", padding, ndim, min_value=0)
        self.dilation = pair(cls, "dilation", dilation, ndim, min_value=1)
        for s, d in zip(self.stride, self.dilation):
            require(s == 1 or d == 1, cls, f"stride {self.stride} and dilation {self.dilation} cannot both be > 1")
        require(not subm or all(s == 1 for s in self.stride), cls, f"subm needs stride 1, got {self.stride}")
        self.subm = bool(subm)
        self.indice_key = indice_key
        self.algo = algo
        self.record_voxel_count = bool(record_voxel_count)
        if self.record_voxel_count and not self.subm:
            self.register_buffer("max_num_voxels_during_training", torch.zeros(1, dtype=torch.int32))

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}" + (", subm=True" if self.subm else ""))

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        check_input(type(self).__name__, x, self.ndim)
        data, indice_dict = kernel_map(self, x)
        src, dst = _pairs(data, x.indices.shape[0])
        features = _reduce(x.features, src, dst, data.out_indices.shape[0], self.REDUCE)
        buf = getattr(self, "max_num_voxels_during_training", None)
        if buf is not None:
            buf.fill_(max(int(buf.item()), data.out_indices.shape[0]))
        out = x.shadow_copy()
        out.indice_dict = indice_dict
        out.features, out.indices, out.spatial_shape = features, data.out_indices, list(data.out_spatial_shape)
        return out


class SparseMaxPool(_SparsePool):
    """Max over the active inputs in each output site's window (spconv's ``SparseMaxPool``)."""


class SparseAvgPool(_SparsePool):
    """Mean over the active inputs in each output site's window (spconv's ``SparseAvgPool``)."""

    REDUCE = "mean"


def _pool_class(base, ndim: int):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, indice_key=None, algo=None,
                 record_voxel_count=False, name=None):
        base.__init__(self, ndim, kernel_size, stride, padding, dilation, indice_key=indice_key, algo=algo,
                      record_voxel_count=record_voxel_count, name=name)
    name = f"{base.__name__}{ndim}d"
    return type(name, (base,), {"__init__": __init__, "__doc__": f"{ndim}-D {base.__doc__}",
                                "__module__": base.__module__, "__qualname__": name})


SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d, SparseMaxPool4d = (_pool_class(SparseMaxPool, n) for n in (1, 2, 3, 4))
SparseAvgPool1d, SparseAvgPool2d, SparseAvgPool3d = (_pool_class(SparseAvgPool, n) for n in (1, 2, 3))


class SparseGlobalMaxOrAvgPool(SparseModule):
    """Per-sample max (``is_mean=False``) or mean over all active sites: a dense ``[batch_size, C]``."""

    def __init__(self, is_mean: bool, name=None):
        super().__init__(name=name)
        self.is_mean = bool(is_mean)

    def forward(self, x: SparseConvTensor) -> torch.Tensor:
        check_input(type(self).__name__, x, x.ndim if isinstance(x, SparseConvTensor) else -1)
        batch = x.indices[:, 0].long()
        if x.indices.shape[0]:
            lo, hi = (int(v) for v in torch.aminmax(batch))
            require(lo >= 0 and hi < x.batch_size, type(self).__name__,
                    f"batch indices must lie in [0, {x.batch_size}), got [{lo}, {hi}]")
        return _reduce(x.features, torch.arange(batch.shape[0], device=batch.device), batch, x.batch_size,
                       "mean" if self.is_mean else "amax")


class SparseGlobalMaxPool(SparseGlobalMaxOrAvgPool):
    def __init__(self, name=None):
        super().__init__(False, name=name)


class SparseGlobalAvgPool(SparseGlobalMaxOrAvgPool):
    def __init__(self, name=None):
        super().__init__(True, name=name)
