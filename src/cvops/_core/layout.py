"""Layouts. Functional ops take ``layout="NCHW"`` (PyTorch) or ``"NHWC"`` (the MLU-OPS docs) and
return the layout they were given; kernels see logical NCHW *views* (a permute, never a copy) and
read the strides, so neither layout pays for a transpose.
"""
from __future__ import annotations

import torch

from .memory import new_empty, new_zeros
from .validate import require

LAYOUTS = ("NCHW", "NHWC")


def parse_layout(op: str, layout) -> str:
    name = layout.upper() if isinstance(layout, str) else layout
    require(name in LAYOUTS, op, f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    return name


def as_nchw(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Logical NCHW view of a 4-D tensor stored in ``layout``."""
    return t if layout == "NCHW" else t.permute(0, 3, 1, 2)


def from_nchw(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Tensor in ``layout`` viewed from a logical NCHW tensor (inverse of :func:`as_nchw`)."""
    return t if layout == "NCHW" else t.permute(0, 2, 3, 1)


def stored_shape(shape_nchw, layout: str) -> tuple:
    """The shape a tensor of logical NCHW shape ``shape_nchw`` has when stored in ``layout``."""
    n, c, h, w = shape_nchw
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def nchw_shape(shape, layout: str) -> tuple:
    """The logical NCHW shape of a 4-D tensor shape given in ``layout`` (inverse of :func:`stored_shape`).
    A shape of another length is returned as is, for the checks to name."""
    if layout == "NHWC" and len(shape) == 4:
        n, h, w, c = shape
        return (n, c, h, w)
    return tuple(shape)


def empty_nchw(shape_nchw, layout: str, *, like: torch.Tensor, zero: bool = False) -> torch.Tensor:
    """A new tensor stored contiguously in ``layout``, returned as its logical NCHW view."""
    alloc = new_zeros if zero else new_empty
    return as_nchw(alloc(stored_shape(shape_nchw, layout), like.dtype, like.device), layout)
