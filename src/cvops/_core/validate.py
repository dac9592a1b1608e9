"""Validation helpers shared by every operator's ``checks.py``.

Each helper raises ``BadParamError`` naming the operator, the argument and the rule, e.g.
``psamask: input channels (15) must equal h_mask * w_mask (16)``.
"""
from __future__ import annotations

import operator
from typing import Iterable, Sequence

import torch

from .errors import BadParamError, NotSupportedError

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)
LARGE_TENSOR_NUM = 2**31  # MLU-OPS LARGE_TENSOR_NUM: element counts at or above are NOT_SUPPORTED


def require(cond: bool, op: str, message: str) -> None:
    """Raise ``BadParamError(op, message)`` unless ``cond``."""
    if not cond:
        raise BadParamError(op, message)


def require_supported(cond: bool, op: str, message: str) -> None:
    """Raise ``NotSupportedError(op, message)`` unless ``cond``."""
    if not cond:
        raise NotSupportedError(op, message)


def check_tensor(op: str, name: str, t, *, dim: int | None = None,
                 dtypes: Sequence[torch.dtype] | None = None) -> None:
    """``t`` is a tensor with ``dim`` dimensions and one of ``dtypes`` (messages are built only on failure:
    these checks run on every call)."""
    if not isinstance(t, torch.Tensor):
        require(False, op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dim is not None and t.dim() != dim:
        require(False, op, f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        require(False, op, f"{name} dtype must be one of ({names}), got {str(t.dtype).replace('torch.', '')}")


def check_int(op: str, name: str, value, *, min_value: int | None = None) -> int:
    """``value`` is an integer (not bool) of at least ``min_value``; returns it as ``int``."""
    if type(value) is int:  # the common case, without the checks below
        ok = True
    else:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok and isinstance(value, torch.Tensor):
            if value.dim() == 0 and not value.is_floating_point() and not value.is_complex() \
                    and value.dtype != torch.bool:
                value, ok = int(value), True
        elif not ok and not isinstance(value, (bool, float, str)) and hasattr(type(value), "__index__"):
            try:  # NumPy integers and other exact integer types
                index = operator.index(value)
                value, ok = index, not isinstance(index, bool)
            except TypeError:
                pass
    if not ok:
        require(False, op, f"{name} must be an int, got {value!r}")
    if min_value is not None and value < min_value:
        require(False, op, f"{name} must be >= {min_value}, got {value}")
    return int(value)


def pair(op: str, name: str, value, n: int = 2, *, min_value: int | None = None) -> tuple[int, ...]:
    """An int or a length-``n`` sequence of ints, as a tuple (torch's ``_pair``/``_triple``)."""
    if isinstance(value, Iterable) and not isinstance(value, (str, torch.Tensor)):
        items = tuple(value)
        require(len(items) == n, op, f"{name} must be an int or {n} ints, got {value!r}")
    else:
        items = (value,) * n
    return tuple(check_int(op, name, v, min_value=min_value) for v in items)


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[first, last)`` that ``t``'s elements can occupy (torch strides are not negative)."""
    reach = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (reach + 1) * t.element_size()


def check_out(op: str, out, shape, source: torch.Tensor) -> None:
    """``out`` can take an op's result of ``shape`` computed from ``source``: a contiguous tensor of
    ``source``'s dtype and device that shares no memory with it. As for torch's functions with ``out=``,
    nothing is differentiated: ``source`` must not want a gradient."""
    check_tensor(op, "out", out)
    if tuple(out.shape) != tuple(shape):
        require(False, op, f"out must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != source.dtype or out.device != source.device:
        require(False, op, f"out must be {source.dtype} on {source.device} like the input, "
                           f"got {out.dtype} on {out.device}")
    require(out.is_contiguous(), op, "out must be contiguous")
    if out.numel() and source.numel():
        (a, b), (c, d) = _byte_span(out), _byte_span(source)
        require(b <= c or d <= a, op, "out must not share memory with the input")
    require(not (torch.is_grad_enabled() and source.requires_grad), op,
            "out= does not differentiate (as torch's functions with out=): the input requires grad")


def check_same_device(op: str, **tensors: torch.Tensor) -> None:
    if all(t.is_cpu for t in tensors.values()):  # the common case, without building a device object per tensor
        return
    devices = [t.device for t in tensors.values()]
    if any(d != devices[0] for d in devices[1:]):
        require(False, op, "tensors must be on one device, got "
                + ", ".join(f"{k}={t.device}" for k, t in tensors.items()))

