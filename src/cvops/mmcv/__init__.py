"""``mmcv.ops`` names, signatures, defaults, return types and numerics, on cvops's implementation
(``from cvops.mmcv import CARAFEPack`` for ``from mmcv.ops import CARAFEPack``; state dicts load unchanged).

What differs from mmcv 2.x, on purpose:

- everything runs on the CPU too (mmcv's CARAFE is CUDA-only) and every backward is deterministic;
- ``MaskedConv2d``/``masked_conv2d`` have a backward (input, weight, bias; mmcv returns no gradients) and
  accept ``bias=None``;
- a bad argument raises :class:`cvops.BadParamError` naming the rule, a ``ValueError`` that is also the
  ``AssertionError`` mmcv's ``assert`` raises; a masked ``MaskedConv2d`` with stride, dilation or groups
  other than 1 raises where mmcv silently computes the stride-1, undilated convolution;
- ``PSAMask`` also accepts ``psa_type`` 0/1 (mmcv's enum values);
- ``batched_nms`` runs ``nms_cfg`` type ``'nms'`` (or a callable) only, and one suppression for any number of
  boxes (mmcv loops over classes above ``split_thr``, with the same result); ``deform_conv2d`` raises on an
  empty output where mmcv's module pads the input and returns an empty tensor.

The names also sit at mmcv's module paths (:mod:`cvops.mmcv.carafe`, ``.masked_conv``, ``.psa_mask``,
``.deform_conv``, ``.nms``); the sparse classes (:mod:`cvops.mmcv.sparse`) keep mmcv's weight layout
``[*kernel, in, out]``. Code that imports ``mmcv.ops`` itself runs on cvops after :func:`install_as_mmcv`.
"""
from __future__ import annotations

import types

from .._core.aliases import drop_modules, new_package, register
from . import carafe as _carafe_module, deform_conv as _deform_conv_module, masked_conv as _masked_conv_module
from . import nms as _nms_module, psa_mask as _psa_mask_module, sparse as _sparse_module
from .carafe import CARAFE, CARAFENaive, CARAFEPack, carafe, carafe_naive
from .deform_conv import DeformConv2d, DeformConv2dPack, deform_conv2d
from .masked_conv import MaskedConv2d, masked_conv2d
from .nms import batched_nms, nms
from .psa_mask import PSAMask
from .sparse import (SparseConv2d, SparseConv3d, SparseConv4d, SparseConvolution, SparseConvTensor,
                     SparseConvTranspose2d, SparseConvTranspose3d, SparseInverseConv2d, SparseInverseConv3d,
                     SparseMaxPool2d, SparseMaxPool3d, SparseModule, SparseSequential, SubMConv2d, SubMConv3d,
                     SubMConv4d)
from .unprovided import MMCV_OPS_LAYOUT, MMCV_REGISTERED, kernel_module, placeholder

__all__ = ["CARAFE", "CARAFENaive", "CARAFEPack", "DeformConv2d", "DeformConv2dPack", "MaskedConv2d", "PSAMask",
           "SparseConv2d", "SparseConv3d", "SparseConv4d", "SparseConvTensor", "SparseConvTranspose2d",
           "SparseConvTranspose3d", "SparseConvolution", "SparseInverseConv2d", "SparseInverseConv3d",
           "SparseMaxPool2d", "SparseMaxPool3d", "SparseModule", "SparseSequential", "SubMConv2d", "SubMConv3d",
           "SubMConv4d", "batched_nms", "carafe", "carafe_naive", "deform_conv2d", "install_as_mmcv",
           "masked_conv2d", "nms"]

# mmcv.ops submodule -> the cvops module that serves its names (the rest of mmcv.ops gets placeholders).
_SERVED = {"carafe": _carafe_module, "deform_conv": _deform_conv_module, "masked_conv": _masked_conv_module,
           "nms": _nms_module, "psa_mask": _psa_mask_module, "sparse_conv": _sparse_module,
           "sparse_modules": _sparse_module, "sparse_pool": _sparse_module, "sparse_structure": _sparse_module}


def install_as_mmcv() -> None:
    """Make ``mmcv.ops`` and every mmcv.ops module path give cvops, for code that imports mmcv.ops itself
    (mmsegmentation, mmdetection, mmdet3d on mmcv-lite). Needs ``mmcv`` (mmcv-lite) and ``mmengine``.

    Registers in ``sys.modules``, in place of any imported before: ``mmcv.ops`` and each submodule of
    :data:`~cvops.mmcv.unprovided.MMCV_OPS_LAYOUT` (cvops's ops where it has them, else
    :func:`~cvops.mmcv.unprovided.placeholder` s that construct and raise when called) and ``mmcv._ext``
    (placeholder kernels); and the classes in mmengine's ``MODELS`` registry under mmcv's names. Call it
    before importing the model code: a module that already imported names from mmcv.ops keeps them."""
    try:
        import mmcv
        from mmengine.registry import MODELS
    except ImportError as err:
        raise ModuleNotFoundError(f"install_as_mmcv needs mmengine and mmcv's Python part (pip install mmengine "
                                  f"mmcv-lite; see the README), and importing them failed: {err}",
                                  name=err.name) from err
    drop_modules("mmcv.ops")
    drop_modules("mmcv._ext")
    register("mmcv._ext", kernel_module())
    ops = new_package("mmcv.ops", "mmcv.ops served by cvops (cvops.mmcv.install_as_mmcv)")
    mmcv.ops = ops
    for name, names in MMCV_OPS_LAYOUT.items():
        served = _SERVED.get(name)
        module = types.ModuleType(f"mmcv.ops.{name}", served.__doc__ if served else "placeholders (cvops)")
        for attr in names:
            value = getattr(served, attr, None) or placeholder(name, attr)
            setattr(module, attr, value)
            setattr(ops, attr, value)
        module.__all__ = list(names)
        register(f"mmcv.ops.{name}", module)
    ops.__all__ = sorted(name for names in MMCV_OPS_LAYOUT.values() for name in names)
    for registered, attr in MMCV_REGISTERED.items():
        MODELS.register_module(name=registered, module=getattr(ops, attr), force=True)
