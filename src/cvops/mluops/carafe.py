"""carafe: ``mluOpCreateCarafeDescriptor``, ``mluOpSetCarafeDescriptor``, ``mluOpCarafeForward`` and
``mluOpCarafeBackward`` on NHWC descriptors and caller-allocated outputs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .._core.errors import Status
from .._core.validate import check_int, require, require_supported
from ..ops.carafe import carafe_backward as _carafe_backward, carafe_forward as _carafe_forward
from ..ops.carafe.checks import check_params, check_shapes
from .descriptor import (DataType, Handle, Layout, TensorDescriptor, check_descriptors, data_of, entry_point,
                         require_each)

__all__ = ["CarafeDescriptor", "carafe_backward", "carafe_forward", "create_carafe_descriptor",
           "set_carafe_descriptor"]

_SET, _FORWARD, _BACKWARD = "mluOpSetCarafeDescriptor", "mluOpCarafeForward", "mluOpCarafeBackward"


@dataclass
class CarafeDescriptor:
    """``mluOpCarafeDescriptor_t``: dimension count, kernel size, group size and scale factor."""

    dimNb: int = 0
    kernel_size: int = 0
    group_size: int = 0
    scale_factor: int = 0


def create_carafe_descriptor() -> CarafeDescriptor:
    """``mluOpCreateCarafeDescriptor`` (unset: every field 0)."""
    return CarafeDescriptor()


@entry_point(_SET, handle=False)
def set_carafe_descriptor(desc: CarafeDescriptor, dimNb: int, kernel_size: int, group_size: int,
                          scale_factor: int) -> Status:
    """``mluOpSetCarafeDescriptor``: BAD_PARAM unless dimNb == 4, k odd >= 1, G >= 1, s >= 1."""
    require(isinstance(desc, CarafeDescriptor), _SET, "carafe_desc is null")
    k, g, s = _carafe_params(_SET, dimNb, kernel_size, group_size, scale_factor)
    desc.dimNb, desc.kernel_size, desc.group_size, desc.scale_factor = 4, k, g, s


def _carafe_params(op: str, dimNb, kernel_size, group_size, scale_factor) -> tuple[int, int, int]:
    dimNb = check_int(op, "dimNb", dimNb)
    require(dimNb == 4, op, f"dimNb must be 4, got {dimNb}")
    return check_params(kernel_size, group_size, scale_factor, op)


def _desc_params(op: str, carafe_desc) -> tuple[int, int, int]:
    require(isinstance(carafe_desc, CarafeDescriptor), op, "carafe_desc is null")
    d = carafe_desc
    return _carafe_params(op, d.dimNb, d.kernel_size, d.group_size, d.scale_factor)


def _check_descs(op: str, descs: dict, k: int, g: int, s: int) -> None:
    """The rules of both directions on NHWC descriptors (semantics.md §4); outputs follow input and mask."""
    require_each(op, descs, dim=4, layout=Layout.NHWC, dtypes=(DataType.HALF, DataType.FLOAT), same_dtype=True)
    inp, mask = descs["input_desc"], descs["mask_desc"]
    n, h, w, c = inp.shape
    for name, d in descs.items():
        require(d.shape[0] == n, op, f"{name} batch ({d.shape[0]}) must equal input batch ({n})")
    for name, d in list(descs.items())[2:]:
        if name == "grad_mask_desc":
            require(d.shape == mask.shape, op, f"{name} shape {d.shape} must equal mask shape {mask.shape}")
        elif name == "grad_input_desc":
            require(d.shape == inp.shape, op, f"{name} shape {d.shape} must equal input shape {inp.shape}")
        else:
            require(d.shape[1:3] == mask.shape[1:3], op,
                    f"{name} spatial size {d.shape[1:3]} must equal mask spatial size {mask.shape[1:3]}")
            require(d.shape[3] == c, op, f"{name} channels ({d.shape[3]}) must equal input channels ({c})")
    check_shapes(op, (n, c, h, w), (mask.shape[0], mask.shape[3], mask.shape[1], mask.shape[2]), k, g, s)


def _require_contiguous(check, op: str, **data) -> None:
    for name, t in data.items():
        check(not isinstance(t, torch.Tensor) or t.is_contiguous(), op,
              f"{name} must be contiguous (stride tensors are not supported)")


@entry_point(_FORWARD)
def carafe_forward(handle: Handle, carafe_desc: CarafeDescriptor, input_desc: TensorDescriptor, input,
                   mask_desc: TensorDescriptor, mask, output_desc: TensorDescriptor, output) -> None:
    """``mluOpCarafeForward``: NHWC input ``[N, H, W, C]``, mask ``[N, sH, sW, G*k*k]`` -> output
    ``[N, sH, sW, C]`` written in place. k > 45 or s > 5 is NOT_SUPPORTED (before any shape rule);
    non-contiguous data is BAD_PARAM; an empty tensor is SUCCESS."""
    op = _FORWARD
    descs = {"input_desc": input_desc, "mask_desc": mask_desc, "output_desc": output_desc}
    check_descriptors(op, descs)
    k, g, s = _desc_params(op, carafe_desc)
    require_supported(k <= 45, op, f"kernel_size ({k}) > 45 is not supported")
    require_supported(s <= 5, op, f"scale_factor ({s}) > 5 is not supported")
    _require_contiguous(require, op, input=input, mask=mask, output=output)
    _check_descs(op, descs, k, g, s)
    if any(d.numel == 0 for d in descs.values()):
        return
    x, m, y = data_of(op, input=(input_desc, input), mask=(mask_desc, mask), output=(output_desc, output))
    y.copy_(_carafe_forward(x, m, k, g, s, layout="NHWC"))


@entry_point(_BACKWARD)
def carafe_backward(handle: Handle, carafe_desc: CarafeDescriptor, input_desc: TensorDescriptor, input,
                    mask_desc: TensorDescriptor, mask, grad_output_desc: TensorDescriptor, grad_output,
                    grad_input_desc: TensorDescriptor, grad_input, grad_mask_desc: TensorDescriptor,
                    grad_mask) -> None:
    """``mluOpCarafeBackward``: writes grad_input ``[N, H, W, C]`` and grad_mask ``[N, sH, sW, G*k*k]``
    (NHWC) in place. Non-contiguous data is NOT_SUPPORTED; k > 137 is NOT_SUPPORTED (after the null
    checks); an empty tensor is SUCCESS. The result is deterministic (gather, no atomics)."""
    op = _BACKWARD
    descs = {"input_desc": input_desc, "mask_desc": mask_desc, "grad_output_desc": grad_output_desc,
             "grad_input_desc": grad_input_desc, "grad_mask_desc": grad_mask_desc}
    check_descriptors(op, descs)
    k, g, s = _desc_params(op, carafe_desc)
    _check_descs(op, descs, k, g, s)
    _require_contiguous(require_supported, op, input=input, mask=mask, grad_output=grad_output,
                        grad_input=grad_input, grad_mask=grad_mask)
    if any(d.numel == 0 for d in descs.values()):
        return
    x, m, gy, gx, gm = data_of(op, input=(input_desc, input), mask=(mask_desc, mask),
                               grad_output=(grad_output_desc, grad_output), grad_input=(grad_input_desc, grad_input),
                               grad_mask=(grad_mask_desc, grad_mask))
    require_supported(k <= 137, op, f"kernel_size ({k}) > 137 is not supported")
    gi, gmask = _carafe_backward(gy, x, m, k, g, s, layout="NHWC")
    gx.copy_(gi)
    gm.copy_(gmask)
