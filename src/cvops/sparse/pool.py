"""Sparse pooling on a kernel map (spconv 2.x's ``SparseMaxPool*``, ``SparseAvgPool*``) and global pooling.

Max and mean run over the active inputs a window reaches (inactive sites take no part; the max's gradient
is split evenly between exact ties); output sites follow the convolution of the same geometry, and
``stride=None`` means ``stride = kernel_size``. docs/SPARSE.md lists where spconv 2.3.8 differs.
"""
from __future__ import annotations

import torch

from .._core.validate import require
from .modules import KernelMapLayer, SparseModule, check_input, kernel_map
from .tensor import SparseConvTensor


def valid_pairs(indice_pairs: torch.Tensor, indice_num: torch.Tensor):
    """All valid ``(input row, output row)`` pairs of a kernel map, as two int64 vectors."""
    valid = torch.arange(indice_pairs.shape[2]) < indice_num.cpu().long()[:, None]
    pairs = indice_pairs.to(torch.int64)
    return pairs[:, 0][valid.to(pairs.device)], pairs[:, 1][valid.to(pairs.device)]


def _reduce(features: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_out: int, how: str):
    rows = features.index_select(0, src)
    out = features.new_zeros(num_out, features.shape[1])
    return out.scatter_reduce(0, dst[:, None].expand(-1, features.shape[1]), rows, how, include_self=False)


class _SparsePool(KernelMapLayer):
    REDUCE = "amax"

    def __init__(self, ndim, kernel_size=3, stride=1, padding=0, dilation=1, indice_key=None, subm=False,
                 algo=None, record_voxel_count=False, name=None):
        super().__init__(name=name)
        self._init_geometry(ndim, kernel_size, kernel_size if stride is None else stride, padding, dilation, subm,
                            indice_key, algo)
        self._init_voxel_count(record_voxel_count)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}" + (", subm=True" if self.subm else ""))

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        check_input(type(self).__name__, x, self.ndim)
        data, indice_dict = kernel_map(self, x)
        src, dst = valid_pairs(data.indice_pairs, data.indice_num)
        features = _reduce(x.features, src, dst, data.out_indices.shape[0], self.REDUCE)
        return self._output(x, indice_dict, features, data.out_indices, data.out_spatial_shape)


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
