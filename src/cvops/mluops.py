"""MLU-OPS-style interface: handles, tensor descriptors, caller-allocated outputs, returned statuses.

Mirrors the C interfaces of the design docs (``mluOpPsamaskForward`` -> :func:`psamask_forward`, ...).
Every function takes a :class:`Handle` first and returns a :class:`Status`; the reason for a failure
is in ``handle.last_error``. Outputs are written in place into the tensors passed as data.
"""
from __future__ import annotations

import torch

from ._core.descriptor import (DataType, Handle, Layout, TensorDescriptor, check_data, check_descriptor,
                               create_handle, create_tensor_descriptor, descriptor_of, returns_status,
                               to_torch_dtype)
from ._core.errors import Status
from ._core.validate import require, require_supported
