"""cvops: the MLU-OPS vision operators for PyTorch, exact and fast on CPU (torch) and GPU (Triton).

Functional ops live here, modules in :mod:`cvops.nn`, the MLU-OPS-style interface in :mod:`cvops.mluops`.
"""
from ._core.errors import BadParamError, CvopsError, NotSupportedError, Status
from ._core.memory import empty_cache
from .ops.psamask import psamask, psamask_backward, psamask_forward
from .ops.carafe import carafe, carafe_backward, carafe_forward, carafe_naive
from .ops.psroipool import psroi_pool, psroi_pool_backward
from .ops.get_indice_pairs import get_conv_output_size, get_deconv_output_size, get_indice_pairs
from .ops.masked_im2col import masked_col2im, masked_conv2d, masked_im2col
from . import mluops, nn  # noqa: E402  (after the ops they wrap)
from . import sparse  # noqa: E402  (sparse conv layers on get_indice_pairs)
from . import spconv  # noqa: E402  (spconv.pytorch 2.x drop-in on cvops.sparse)
from ._core.dispatch import defer_dynamo_import  # noqa: E402

defer_dynamo_import()  # the first op call imports no compiler stack it does not use
from . import torchvision  # noqa: E402  (torchvision.ops drop-ins: ps_roi_pool, PSRoIPool)
from ._core import autocast as _autocast  # noqa: E402

_autocast.register()  # torch.autocast policies of every custom op (after the ops are defined)

__version__ = "0.1.0"
