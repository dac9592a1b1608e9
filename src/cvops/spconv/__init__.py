"""``import cvops.spconv as spconv``: spconv.pytorch 2.x's names, signatures, weight layout and
conventions on cvops's sparse convolution (CPU, and Triton on CUDA; deterministic; forward and backward).

Code written for spconv 2.x runs with only its import changed, and spconv 2.x checkpoints load with a
plain ``load_state_dict`` (weights ``[out, *kernel, in]``). The layers are :mod:`cvops.sparse`'s: this
package only lays them out under spconv's module paths (``cvops.spconv.conv.SparseConvolution``,
``cvops.spconv.pool``, ``cvops.spconv.functional``, ...). docs/SPARSE.md lists what differs on purpose.
"""
from . import conv, core, functional, modules, ops, pool, tables  # noqa: F401  (spconv's module paths)
from .conv import *  # noqa: F401,F403
from .conv import SparseConvolution
from .core import SparseConvTensor
from .identity import Identity
from .modules import (RemoveGrid, SparseBatchNorm, SparseIdentity, SparseModule, SparseReLU, SparseSequential,
                      ToDense, assign_name_for_sparse_modules)
from .ops import ConvAlgo
from .pool import (SparseAvgPool1d, SparseAvgPool2d, SparseAvgPool3d, SparseGlobalAvgPool, SparseGlobalMaxPool,
                   SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d, SparseMaxPool4d)
from .tables import AddTable, ConcatTable, JoinTable

__all__ = ["AddTable", "ConcatTable", "ConvAlgo", "Identity", "JoinTable", "RemoveGrid", "SparseAvgPool1d",
           "SparseAvgPool2d", "SparseAvgPool3d", "SparseBatchNorm", "SparseConvTensor", "SparseConvolution",
           "SparseGlobalAvgPool", "SparseGlobalMaxPool", "SparseIdentity", "SparseMaxPool1d", "SparseMaxPool2d",
           "SparseMaxPool3d", "SparseMaxPool4d", "SparseModule", "SparseReLU", "SparseSequential", "ToDense",
           "assign_name_for_sparse_modules", "conv", "core", "functional", "modules", "ops", "pool", "tables",
           *conv.__all__]
