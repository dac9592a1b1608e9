"""spconv.pytorch.modules: ``SparseModule``, ``SparseSequential`` and the small sparse modules."""
from torch import nn

from ..sparse.modules import (RemoveGrid, SparseBatchNorm, SparseIdentity, SparseModule, SparseReLU,
                              SparseSequential, ToDense)
from ..sparse.modules import SparseConvolution


def is_spconv_module(module) -> bool:
    return isinstance(module, SparseModule)


def is_sparse_conv(module) -> bool:
    return isinstance(module, SparseConvolution)


def assign_name_for_sparse_modules(module: nn.Module) -> None:
    """Sets every sparse module's ``_sparse_unique_name`` to its qualified name (spconv's helper)."""
    for name, child in module.named_modules():
        if isinstance(child, SparseModule):
            child._sparse_unique_name = name


__all__ = ["RemoveGrid", "SparseBatchNorm", "SparseIdentity", "SparseModule", "SparseReLU", "SparseSequential",
           "ToDense", "assign_name_for_sparse_modules", "is_sparse_conv", "is_spconv_module"]
