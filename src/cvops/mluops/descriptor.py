"""Handles, tensor descriptors and status plumbing for the MLU-OPS-style API (``cvops.mluops``).

The C interface passes a descriptor (layout, dtype, shape) beside a raw pointer. Here the
"pointer" is a torch tensor (``None`` plays the null pointer) that must be dense and agree with
its descriptor. Functions return a :class:`Status` instead of raising; the reason for the last
non-SUCCESS status is kept on the handle (``handle.last_error``), like the library's log.
"""
from __future__ import annotations

import contextlib
import enum
import functools
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from .._core.errors import BadParamError, CvopsError, Status
from .._core.validate import LARGE_TENSOR_NUM, check_int, require, require_supported


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
    """``mluOpTensorDescriptor_t``: layout, data type and dense shape, checked on creation
    (:class:`BadParamError`); a negative size is representable, as in C, and BAD_PARAM at an entry point."""

    layout: Layout
    dtype: DataType
    shape: tuple[int, ...]

    def __post_init__(self):
        op = "mluOpSetTensorDescriptor"
        object.__setattr__(self, "layout", _enum_member(op, "layout", Layout, self.layout))
        object.__setattr__(self, "dtype", _enum_member(op, "dtype", DataType, self.dtype))
        shape = self.shape
        require(hasattr(shape, "__iter__") and not isinstance(shape, (str, bytes, dict)), op,
                f"shape must be a sequence of ints, got {type(shape).__name__}")
        object.__setattr__(self, "shape", tuple(check_int(op, f"shape[{i}]", size) for i, size in enumerate(shape)))

    @property
    def dim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element (1 for ``INVALID``, so byte limits can still be checked)."""
        return 1 if self.dtype == DataType.INVALID else _TORCH_OF[self.dtype].itemsize


def _enum_member(op: str, name: str, enum_type, value):
    if isinstance(value, int) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return enum_type(value)
    raise BadParamError(op, f"{name} must be a {enum_type.__name__}, got {value!r}")


def create_tensor_descriptor(layout: Layout, dtype: DataType, shape: Sequence[int]) -> TensorDescriptor:
    """``mluOpSetTensorDescriptor``; an unknown layout or dtype or a non-int size raises
    :class:`BadParamError` (a constructor has no status to return)."""
    return TensorDescriptor(layout, dtype, shape)


def descriptor_of(t: torch.Tensor, layout: Layout = Layout.ARRAY) -> TensorDescriptor:
    """Descriptor of a dense tensor, with the given layout tag."""
    require(isinstance(t, torch.Tensor), "descriptor_of", f"t must be a torch.Tensor, got {type(t).__name__}")
    return TensorDescriptor(layout, from_torch_dtype(t.dtype), tuple(t.shape))


def check_descriptor(op: str, name: str, desc, *, size_limit: bool = True) -> TensorDescriptor:
    """A descriptor argument: not null, sizes >= 0 (BAD_PARAM); fewer than 2^31 elements unless not
    ``size_limit`` (NOT_SUPPORTED, MLU-OPS ``LARGE_TENSOR_NUM``)."""
    require(desc is not None, op, f"{name} is null")
    require(isinstance(desc, TensorDescriptor), op, f"{name} must be a TensorDescriptor")
    require(all(s >= 0 for s in desc.shape), op, f"{name} sizes must be >= 0, got {desc.shape}")
    require_supported(not size_limit or desc.numel < LARGE_TENSOR_NUM, op, f"{name} has 2^31 or more elements")
    return desc


def check_descriptors(op: str, descs: dict) -> None:
    """:func:`check_descriptor` of each ``name: descriptor``, all of them before any other rule."""
    for name, desc in descs.items():
        check_descriptor(op, name, desc)


def require_each(op: str, descs: dict, *, dim: int | None = None, layout: Layout | None = None,
                 dtypes: tuple = (), same_dtype: bool = False) -> None:
    """Each ``name: descriptor`` has ``dim`` dimensions, ``layout`` and a dtype among ``dtypes`` (those
    given), and with ``same_dtype`` the first one's dtype; BAD_PARAM naming the descriptor otherwise."""
    first_name, first = next(iter(descs.items()))
    for name, d in descs.items():
        require(dim is None or d.dim == dim, op, f"{name} must be {dim}-D, got {d.dim}-D")
        require(layout is None or d.layout == layout, op,
                f"{name} layout must be {getattr(layout, 'name', '')}, got {d.layout.name}")
        require(not dtypes or d.dtype in dtypes, op,
                f"{name} dtype must be {' or '.join(t.name for t in dtypes)}, got {d.dtype.name}")
        require(not same_dtype or d.dtype == first.dtype, op,
                f"{name} dtype ({d.dtype.name}) must equal {first_name} dtype ({first.dtype.name})")


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


def data_of(op: str, **pairs) -> list[torch.Tensor]:
    """:func:`check_data` of each ``name=(descriptor, data)``, in order."""
    return [check_data(op, name, desc, data) for name, (desc, data) in pairs.items()]


def check_workspace(op: str, workspace, workspace_size) -> int:
    """The workspace arguments of an entry point: ``workspace_size`` an int >= 0, and no null workspace
    when it is > 0 (BAD_PARAM otherwise). Returns the size."""
    workspace_size = check_int(op, "workspace_size", workspace_size, min_value=0)
    require(workspace_size == 0 or workspace is not None, op, "workspace is null but workspace_size > 0")
    return workspace_size


def entry_point(name: str, *, handle: bool = True, query: bool = False):
    """Make a function that raises :class:`CvopsError` the C entry point ``name``: it never raises, and
    returns a :class:`Status` (or the function's own), or for a workspace query ``(status, size)`` with size
    0 on failure. With ``handle`` the first argument must be a :class:`Handle`, which gets the reason.

    Any exception other than a :class:`CvopsError` is ``INTERNAL_ERROR`` (``ALLOC_FAILED`` for out of
    memory), so a check that slipped still shows in tests that expect ``BAD_PARAM``. Outputs are written
    under ``no_grad`` (plain buffers, as in the C API).
    """

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            h = (args[0] if args else kwargs.get("handle")) if handle else None
            status, message, result = Status.SUCCESS, "", None
            try:
                require(not handle or isinstance(h, Handle), name, "handle is null")
                with torch.no_grad():
                    result = fn(*args, **kwargs)
            except CvopsError as err:
                status, message = err.status, str(err)
            except MemoryError as err:
                status, message = Status.ALLOC_FAILED, f"{name}: out of memory: {err}"
            except Exception as err:  # noqa: BLE001 -- a C entry point returns a status whatever happens
                out_of_memory = isinstance(err, getattr(torch, "OutOfMemoryError", ()))
                status = Status.ALLOC_FAILED if out_of_memory else Status.INTERNAL_ERROR
                message = f"{name}: {type(err).__name__}: {err}"
            if isinstance(h, Handle):
                h.last_error = message
            if query:
                return status, (result if status == Status.SUCCESS else 0)
            return result if status == Status.SUCCESS and result is not None else status

        return wrapper

    return decorate
