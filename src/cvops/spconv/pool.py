"""spconv.pytorch.pool: sparse max / avg pooling on a kernel map and the global pools."""
from ..sparse.pool import (SparseAvgPool, SparseAvgPool1d, SparseAvgPool2d, SparseAvgPool3d,
                           SparseGlobalAvgPool, SparseGlobalMaxOrAvgPool, SparseGlobalMaxPool, SparseMaxPool,
                           SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d, SparseMaxPool4d)

ALL_POOL_LAYERS = {SparseAvgPool3d, SparseAvgPool2d, SparseAvgPool1d, SparseMaxPool1d, SparseMaxPool2d,
                   SparseMaxPool3d, SparseMaxPool4d, SparseAvgPool, SparseMaxPool}

__all__ = ["ALL_POOL_LAYERS", "SparseAvgPool", "SparseAvgPool1d", "SparseAvgPool2d", "SparseAvgPool3d",
           "SparseGlobalAvgPool", "SparseGlobalMaxOrAvgPool", "SparseGlobalMaxPool", "SparseMaxPool",
           "SparseMaxPool1d", "SparseMaxPool2d", "SparseMaxPool3d", "SparseMaxPool4d"]
