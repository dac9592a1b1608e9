"""``import cvops.spconv as spconv``: spconv.pytorch 2.x's names, signatures, weight layout
(``[out, *kernel, in]``: checkpoints load unchanged) and module paths (``cvops.spconv.conv``, ``.pool``,
``.functional``, ...) on :mod:`cvops.sparse`'s layers. docs/SPARSE.md lists what differs on purpose.
"""
import sys
import types

from .._core.aliases import drop_modules, new_package, register, register_submodules
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

__all__ = ["AddTable", "ConcatTable", "ConvAlgo", "Identity", "JoinTable", "RemoveGrid", "SPCONV_VERSION",
           "SparseAvgPool1d", "SparseAvgPool2d", "SparseAvgPool3d", "SparseBatchNorm", "SparseConvTensor",
           "SparseConvolution", "SparseGlobalAvgPool", "SparseGlobalMaxPool", "SparseIdentity", "SparseMaxPool1d",
           "SparseMaxPool2d", "SparseMaxPool3d", "SparseMaxPool4d", "SparseModule", "SparseReLU", "SparseSequential",
           "ToDense", "assign_name_for_sparse_modules", "conv", "core", "functional", "install_as_spconv", "modules",
           "ops", "pool", "tables", *conv.__all__]

# The spconv release whose names, signatures and numerics this package follows (the anchor of its tests);
# install_as_spconv gives it to the ``spconv`` package it registers, for code that checks spconv's version.
SPCONV_VERSION = "2.3.8"


def install_as_spconv() -> None:
    """Make ``import spconv``, ``import spconv.pytorch`` and its submodules give this package, for code that
    imports spconv itself (OpenPCDet, mmdet3d). The ``spconv`` package it registers, in place of any imported
    before, has ``__version__`` = :data:`SPCONV_VERSION`, ``core.ConvAlgo`` and ``constants`` (spconv's flags
    at spconv's values, which code reads or sets and cvops never reads). Call it before importing such code;
    spconv's voxel generators (``spconv.utils``) are not part of cvops."""
    drop_modules("spconv")
    top = new_package("spconv", "cvops.spconv registered as spconv (cvops.spconv.install_as_spconv)")
    top.__version__ = SPCONV_VERSION
    constants = types.ModuleType("spconv.constants", "spconv's flags and kernel switches; cvops reads none")
    # spconv 2.3.8's values: weights are KRSC ([out, *kernel, in]), not HWIO; the direct-table hash is on
    for flag, value in (("ALL_WEIGHT_IS_KRSC", True), ("FILTER_HWIO", False), ("SAVED_WEIGHT_LAYOUT", ""),
                        ("SPCONV_USE_DIRECT_TABLE", True)):
        setattr(constants, flag, value)
    register("spconv.constants", constants)
    core = types.ModuleType("spconv.core", "spconv.core's ConvAlgo (cvops.spconv.ConvAlgo)")
    core.ConvAlgo = ConvAlgo
    register("spconv.core", core)
    register("spconv.pytorch", sys.modules[__name__])
    register_submodules(__name__, "spconv.pytorch")  # this package's submodules, all imported above
