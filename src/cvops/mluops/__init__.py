"""MLU-OPS-style interface, mirroring the design docs' C functions (``mluOpPsamaskForward`` ->
:func:`psamask_forward`, ...): a :class:`Handle` first, tensor descriptors beside the data, outputs written
in place, and a :class:`Status` returned (workspace queries: ``(status, size)``; the reason for a failure
in ``handle.last_error``).
"""
from .._core.errors import Status
from .carafe import (CarafeDescriptor, carafe_backward, carafe_forward, create_carafe_descriptor,
                     set_carafe_descriptor)
from .descriptor import (DataType, Handle, Layout, TensorDescriptor, create_handle, create_tensor_descriptor,
                         descriptor_of)
from .masked_im2col import get_masked_im2col_forward_workspace_size, masked_im2col_forward
from .psamask import psamask_backward, psamask_forward
from .psroipool import get_psroipool_workspace_size, psroipool_backward, psroipool_forward
from .sparse_conv import (SparseConvolutionDescriptor, create_sparse_convolution_descriptor, get_indice_pairs,
                          get_indice_pairs_workspace_size, get_sparse_convolution_num_act_out,
                          set_sparse_convolution_descriptor)

__all__ = ["CarafeDescriptor", "DataType", "Handle", "Layout", "SparseConvolutionDescriptor", "Status",
           "TensorDescriptor", "carafe_backward", "carafe_forward", "create_carafe_descriptor", "create_handle",
           "create_sparse_convolution_descriptor", "create_tensor_descriptor", "descriptor_of", "get_indice_pairs",
           "get_indice_pairs_workspace_size", "get_masked_im2col_forward_workspace_size",
           "get_psroipool_workspace_size", "get_sparse_convolution_num_act_out", "masked_im2col_forward",
           "psamask_backward", "psamask_forward", "psroipool_backward", "psroipool_forward",
           "set_carafe_descriptor", "set_sparse_convolution_descriptor"]
