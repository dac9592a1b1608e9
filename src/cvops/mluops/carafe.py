"""MLU-OPS interface of carafe: ``mluOpCreateCarafeDescriptor``, ``mluOpSetCarafeDescriptor``,
``mluOpCarafeForward`` and ``mluOpCarafeBackward`` on NHWC descriptors and caller-allocated outputs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .descriptor import (DataType, Handle, Layout, TensorDescriptor, check_data, check_descriptor,
                                returns_status, status_of)
from .._core.errors import Status
from .._core.validate import check_int, require, require_supported
from ..ops.carafe import carafe_backward as _carafe_backward, carafe_forward as _carafe_forward
from ..ops.carafe.checks import check_shapes

__all__ = ["CarafeDescriptor", "carafe_backward", "carafe_forward", "create_carafe_descriptor",
           "set_carafe_descriptor"]


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


def set_carafe_descriptor(desc: CarafeDescriptor, dimNb: int, kernel_size: int, group_size: int,
                          scale_factor: int) -> Status:
    """``mluOpSetCarafeDescriptor``: BAD_PARAM unless dimNb == 4, k odd >= 1, G >= 1, s >= 1."""
    op = "mluOpSetCarafeDescriptor"

    def store():
        require(isinstance(desc, CarafeDescriptor), op, "carafe_desc is null")
        values = _carafe_values(op, dimNb, kernel_size, group_size, scale_factor)
        desc.dimNb, desc.kernel_size, desc.group_size, desc.scale_factor = values

    return status_of(op, None, store)[0]


def _carafe_values(op: str, dimNb, kernel_size, group_size, scale_factor) -> tuple[int, int, int, int]:
    dimNb = check_int(op, "dimNb", dimNb)
    require(dimNb == 4, op, f"dimNb must be 4, got {dimNb}")
    kernel_size = check_int(op, "kernel_size", kernel_size)
    require(kernel_size >= 1 and kernel_size % 2 == 1, op, f"kernel_size must be odd and >= 1, got {kernel_size}")
    group_size = check_int(op, "group_size", group_size, min_value=1)
    scale_factor = check_int(op, "scale_factor", scale_factor, min_value=1)
    return dimNb, kernel_size, group_size, scale_factor


def _carafe_desc_params(op: str, carafe_desc) -> tuple[int, int, int]:
    require(isinstance(carafe_desc, CarafeDescriptor), op, "carafe_desc is null")
    d = carafe_desc
    return _carafe_values(op, d.dimNb, d.kernel_size, d.group_size, d.scale_factor)[1:]


def _carafe_shapes(op: str, descs: dict, k: int, g: int, s: int, out_names: tuple[str, ...]) -> None:
    """The shape rules of both directions on NHWC descriptors (semantics.md §4)."""
    for name, d in descs.items():
        require(d.dim == 4, op, f"{name} must be 4-D, got {d.dim}-D")
    for name, d in descs.items():
        require(d.layout == Layout.NHWC, op, f"{name} layout must be NHWC, got {d.layout.name}")
    inp, mask = descs["input_desc"], descs["mask_desc"]
    n, h, w, c = inp.shape
    for name, d in descs.items():
        require(d.shape[0] == n, op, f"{name} batch ({d.shape[0]}) must equal input batch ({n})")
    for name in out_names:
        d = descs[name]
        if name.startswith("grad_mask"):
            require(d.shape == mask.shape, op, f"{name} shape {d.shape} must equal mask shape {mask.shape}")
        elif name == "grad_input_desc":
            require(d.shape == inp.shape, op, f"{name} shape {d.shape} must equal input shape {inp.shape}")
        else:
            require(d.shape[1:3] == mask.shape[1:3], op,
                    f"{name} spatial size {d.shape[1:3]} must equal mask spatial size {mask.shape[1:3]}")
            require(d.shape[3] == c, op, f"{name} channels ({d.shape[3]}) must equal input channels ({c})")
    check_shapes(op, (n, c, h, w), (mask.shape[0], mask.shape[3], mask.shape[1], mask.shape[2]), k, g, s)


def _carafe_dtypes(op: str, descs: dict) -> None:
    first = next(iter(descs.values())).dtype
    for name, d in descs.items():
        require(d.dtype in (DataType.HALF, DataType.FLOAT), op, f"{name} dtype must be HALF or FLOAT, got {d.dtype.name}")
        require(d.dtype == first, op, f"{name} dtype ({d.dtype.name}) must equal the other tensors' ({first.name})")


@returns_status
def carafe_forward(handle: Handle, carafe_desc: CarafeDescriptor, input_desc: TensorDescriptor, input,
                   mask_desc: TensorDescriptor, mask, output_desc: TensorDescriptor, output) -> None:
    """``mluOpCarafeForward``: NHWC input ``[N, H, W, C]``, mask ``[N, sH, sW, G*k*k]`` -> output
    ``[N, sH, sW, C]`` written in place. k > 45 or s > 5 is NOT_SUPPORTED; an empty tensor is SUCCESS."""
    op = "mluOpCarafeForward"
    descs = {"input_desc": input_desc, "mask_desc": mask_desc, "output_desc": output_desc}
    for name, d in descs.items():
        check_descriptor(op, name, d)
    k, g, s = _carafe_desc_params(op, carafe_desc)
    require_supported(k <= 45, op, f"kernel_size ({k}) > 45 is not supported")
    require_supported(s <= 5, op, f"scale_factor ({s}) > 5 is not supported")
    for name, t in (("input", input), ("mask", mask), ("output", output)):
        require(not isinstance(t, torch.Tensor) or t.is_contiguous(), op, f"{name} must be contiguous")
    _carafe_dtypes(op, descs)
    _carafe_shapes(op, descs, k, g, s, ("output_desc",))
    if any(d.numel == 0 for d in descs.values()):
        return None
    x = check_data(op, "input", input_desc, input)
    m = check_data(op, "mask", mask_desc, mask)
    y = check_data(op, "output", output_desc, output)
    with torch.no_grad():
        y.copy_(_carafe_forward(x, m, k, g, s, layout="NHWC"))
    return None


@returns_status
def carafe_backward(handle: Handle, carafe_desc: CarafeDescriptor, input_desc: TensorDescriptor, input,
                    mask_desc: TensorDescriptor, mask, grad_output_desc: TensorDescriptor, grad_output,
                    grad_input_desc: TensorDescriptor, grad_input, grad_mask_desc: TensorDescriptor,
                    grad_mask) -> None:
    """``mluOpCarafeBackward``: writes grad_input ``[N, H, W, C]`` and grad_mask ``[N, sH, sW, G*k*k]``
    (NHWC) in place. Non-contiguous data is NOT_SUPPORTED; k > 137 is NOT_SUPPORTED; an empty tensor
    is SUCCESS. The result is deterministic (gather, no atomics)."""
    op = "mluOpCarafeBackward"
    descs = {"input_desc": input_desc, "mask_desc": mask_desc, "grad_output_desc": grad_output_desc,
             "grad_input_desc": grad_input_desc, "grad_mask_desc": grad_mask_desc}
    for name, d in descs.items():
        check_descriptor(op, name, d)
    k, g, s = _carafe_desc_params(op, carafe_desc)
    _carafe_shapes(op, descs, k, g, s, ("grad_output_desc", "grad_input_desc", "grad_mask_desc"))
    _carafe_dtypes(op, descs)
    for name, t in (("input", input), ("mask", mask), ("grad_output", grad_output), ("grad_input", grad_input),
                    ("grad_mask", grad_mask)):
        require_supported(not isinstance(t, torch.Tensor) or t.is_contiguous(), op,
                          f"{name} must be contiguous (stride tensors are not supported)")
    if any(d.numel == 0 for d in descs.values()):
        return None
    x = check_data(op, "input", input_desc, input)
    m = check_data(op, "mask", mask_desc, mask)
    gy = check_data(op, "grad_output", grad_output_desc, grad_output)
    gx = check_data(op, "grad_input", grad_input_desc, grad_input)
    gm = check_data(op, "grad_mask", grad_mask_desc, grad_mask)
    require_supported(k <= 137, op, f"kernel_size ({k}) > 137 is not supported")
    with torch.no_grad():
        gi, gmask = _carafe_backward(gy, x, m, k, g, s, layout="NHWC")
    gx.copy_(gi)
    gm.copy_(gmask)
    return None
