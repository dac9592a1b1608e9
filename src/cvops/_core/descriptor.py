"""Handles, tensor descriptors and status plumbing for the MLU-OPS-style API (``cvops.mluops``).

The C interface passes a descriptor (layout, dtype, shape) beside a raw pointer. Here the
"pointer" is a torch tensor (``None`` plays the null pointer) that must be dense and agree with
its descriptor. Functions return a :class:`Status` instead of raising; the reason for the last
non-SUCCESS status is kept on the handle (``handle.last_error``), like the library's log.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .errors import BadParamError, CvopsError, Status
from .validate import LARGE_TENSOR_NUM, require, require_supported


class Layout(enum.IntEnum):
    """``mluOpTensorLayout_t``"""

    NCHW = 0
    NHWC = 1
    HWCN = 2
    NDHWC = 3
    ARRAY = 4
    NCDHW = 5


class DataType(enum.IntEnum):
    """``mluOpDataType_t``"""

    INVALID = 0
    HALF = 1
    FLOAT = 2
    DOUBLE = 3
    INT8 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    BOOL = 12
    BFLOAT16 = 15


_TORCH_OF = {DataType.HALF: torch.float16, DataType.FLOAT: torch.float32, DataType.DOUBLE: torch.float64,
             DataType.INT8: torch.int8, DataType.INT16: torch.int16, DataType.INT32: torch.int32,
             DataType.INT64: torch.int64, DataType.BOOL: torch.bool, DataType.BFLOAT16: torch.bfloat16}
_DTYPE_OF = {v: k for k, v in _TORCH_OF.items()}


def to_torch_dtype(dtype: DataType) -> torch.dtype:
    return _TORCH_OF[DataType(dtype)]


def from_torch_dtype(dtype: torch.dtype) -> DataType:
    return _DTYPE_OF.get(dtype, DataType.INVALID)


@dataclass
class Handle:
    """``mluOpHandle_t``: the device work runs on and the reason for the last failure."""

    device: torch.device = torch.device("cpu")
    last_error: str = ""


def create_handle(device: torch.device | str = "cpu") -> Handle:
    return Handle(torch.device(device))


@dataclass(frozen=True)
class TensorDescriptor:
    """``mluOpTensorDescriptor_t``: layout, data type and dense shape (no stride tensors)."""

    layout: Layout
    dtype: DataType
    shape: tuple[int, ...]

    @property
    def dim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def create_tensor_descriptor(layout: Layout, dtype: DataType, shape: Sequence[int]) -> TensorDescriptor:
    """``mluOpSetTensorDescriptor``."""
    return TensorDescriptor(Layout(layout), DataType(dtype), tuple(int(s) for s in shape))


def descriptor_of(t: torch.Tensor, layout: Layout = Layout.ARRAY) -> TensorDescriptor:
    """Descriptor of a dense tensor, with the given layout tag."""
    return TensorDescriptor(Layout(layout), from_torch_dtype(t.dtype), tuple(t.shape))


def check_descriptor(op: str, name: str, desc) -> TensorDescriptor:
    require(desc is not None, op, f"{name} is null")
    require(isinstance(desc, TensorDescriptor), op, f"{name} must be a TensorDescriptor")
    require_supported(desc.numel < LARGE_TENSOR_NUM, op, f"{name} has 2^31 or more elements")
    return desc


def check_data(op: str, name: str, desc: TensorDescriptor, data) -> torch.Tensor:
    """The tensor behind a descriptor: not null, dense, same shape and dtype as described."""
    require(data is not None, op, f"{name} is null")
    require(isinstance(data, torch.Tensor), op, f"{name} must be a torch.Tensor")
    require(tuple(data.shape) == desc.shape, op,
            f"{name} shape {tuple(data.shape)} does not match its descriptor {desc.shape}")
    require(from_torch_dtype(data.dtype) == desc.dtype, op,
            f"{name} dtype {data.dtype} does not match its descriptor {desc.dtype.name}")
    require(data.is_contiguous(), op, f"{name} must be dense (contiguous) as its descriptor describes")
    return data


def returns_status(fn: Callable[..., None]) -> Callable[..., Status]:
    """Turn a function that raises :class:`CvopsError` into one that returns a :class:`Status`.

    The wrapped function receives the handle first; ``None`` as handle is BAD_PARAM.
    """

    @functools.wraps(fn)
    def wrapper(handle, *args, **kwargs) -> Status:
        try:
            if not isinstance(handle, Handle):
                raise BadParamError(fn.__name__, "handle is null")
            status = fn(handle, *args, **kwargs)
        except CvopsError as err:
            if isinstance(handle, Handle):
                handle.last_error = str(err)
            return err.status
        if isinstance(handle, Handle):
            handle.last_error = ""
        return Status.SUCCESS if status is None else status

    return wrapper
