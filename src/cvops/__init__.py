"""cvops: the MLU-OPS vision operators for PyTorch, exact and fast on CPU (torch) and GPU (Triton).

Functional ops live here, modules in :mod:`cvops.nn`, sparse convolution in :mod:`cvops.sparse`, the
MLU-OPS-style interface in :mod:`cvops.mluops`, its accuracy criteria in :mod:`cvops.metrics`, and the
drop-in namespaces of the peers in :mod:`cvops.spconv`, :mod:`cvops.mmcv` (imported on use) and
:mod:`cvops.torchvision`.
"""
from ._core import autocast as _autocast
from ._core.errors import BadParamError, CvopsError, NotSupportedError, Status
from ._core.memory import empty_cache
from .ops.carafe import carafe, carafe_backward, carafe_forward, carafe_naive
from .ops.get_indice_pairs import get_conv_output_size, get_deconv_output_size, get_indice_pairs
from .ops.masked_im2col import masked_col2im, masked_conv2d, masked_im2col
from .ops.psamask import psamask, psamask_backward, psamask_forward
from .ops.psroipool import psroi_pool, psroi_pool_backward
from . import metrics, mluops, nn, sparse, spconv, torchvision  # the layers over the ops above

_autocast.register()  # torch.autocast policies of every custom op, once all are defined

__version__ = "0.1.0"  # the one source of the version (pyproject reads it)
__all__ = ["BadParamError", "CvopsError", "NotSupportedError", "Status", "carafe", "carafe_backward",
           "carafe_forward", "carafe_naive", "empty_cache", "get_conv_output_size", "get_deconv_output_size",
           "get_indice_pairs", "masked_col2im", "masked_conv2d", "masked_im2col", "metrics", "mluops", "nn",
           "psamask", "psamask_backward", "psamask_forward", "psroi_pool", "psroi_pool_backward", "sparse",
           "spconv", "torchvision"]
