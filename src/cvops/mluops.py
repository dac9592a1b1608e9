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
from ._core.errors import BadParamError, Status
from ._core.validate import require, require_supported


# ---------------------------------------------------------------------------------------------
# carafe (mluOpCreateCarafeDescriptor / mluOpSetCarafeDescriptor / mluOpCarafeForward / Backward)

from dataclasses import dataclass as _dataclass  # noqa: E402

from ._core.errors import BadParamError as _BadParamError  # noqa: E402


@_dataclass
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
    op = "set_carafe_descriptor"
    try:
        require(isinstance(desc, CarafeDescriptor), op, "carafe_desc is null")
        require(dimNb == 4, op, f"dimNb must be 4, got {dimNb}")
        require(kernel_size >= 1 and kernel_size % 2 == 1, op, f"kernel_size must be odd and >= 1, got {kernel_size}")
        require(group_size >= 1, op, f"group_size must be >= 1, got {group_size}")
        require(scale_factor >= 1, op, f"scale_factor must be >= 1, got {scale_factor}")
    except _BadParamError:
        return Status.BAD_PARAM
    desc.dimNb, desc.kernel_size, desc.group_size, desc.scale_factor = dimNb, kernel_size, group_size, scale_factor
    return Status.SUCCESS


def _carafe_desc_params(op: str, carafe_desc) -> tuple[int, int, int]:
    require(isinstance(carafe_desc, CarafeDescriptor), op, "carafe_desc is null")
    d = carafe_desc
    require(d.dimNb == 4, op, f"carafe_desc dimNb must be 4, got {d.dimNb}")
    require(d.kernel_size >= 1 and d.kernel_size % 2 == 1, op,
            f"kernel_size must be odd and >= 1, got {d.kernel_size}")
    require(d.group_size >= 1, op, f"group_size must be >= 1, got {d.group_size}")
    require(d.scale_factor >= 1, op, f"scale_factor must be >= 1, got {d.scale_factor}")
    return d.kernel_size, d.group_size, d.scale_factor


def _carafe_shapes(op: str, descs: dict, k: int, g: int, s: int, out_names: tuple[str, ...]) -> None:
    """The shape rules of both directions on NHWC descriptors (semantics.md §4)."""
    from .ops.carafe.checks import check_shapes
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
    op = "carafe_forward"
    descs = {"input_desc": input_desc, "mask_desc": mask_desc, "output_desc": output_desc}
    for name, d in descs.items():
        check_descriptor(op, name, d)
    k, g, s = _carafe_desc_params(op, carafe_desc)
    require_supported(k <= 45, op, f"kernel_size ({k}) > 45 is not supported")
    require_supported(s <= 5, op, f"scale_factor ({s}) > 5 is not supported")
    for name, d in descs.items():
        require(d.dim == 4, op, f"{name} must be 4-D, got {d.dim}-D")
    for name, d in descs.items():
        require(d.layout == Layout.NHWC, op, f"{name} layout must be NHWC, got {d.layout.name}")
    for name, t in (("input", input), ("mask", mask), ("output", output)):
        require(not isinstance(t, torch.Tensor) or t.is_contiguous(), op, f"{name} must be contiguous")
    _carafe_dtypes(op, descs)
    _carafe_shapes(op, descs, k, g, s, ("output_desc",))
    if any(d.numel == 0 for d in descs.values()):
        return None
    x = check_data(op, "input", input_desc, input)
    m = check_data(op, "mask", mask_desc, mask)
    y = check_data(op, "output", output_desc, output)
    from .ops.carafe import carafe_forward as _fwd
    with torch.no_grad():
        y.copy_(_fwd(x, m, k, g, s, layout="NHWC"))
    return None


@returns_status
def carafe_backward(handle: Handle, carafe_desc: CarafeDescriptor, input_desc: TensorDescriptor, input,
                    mask_desc: TensorDescriptor, mask, grad_output_desc: TensorDescriptor, grad_output,
                    grad_input_desc: TensorDescriptor, grad_input, grad_mask_desc: TensorDescriptor,
                    grad_mask) -> None:
    """``mluOpCarafeBackward``: writes grad_input ``[N, H, W, C]`` and grad_mask ``[N, sH, sW, G*k*k]``
    (NHWC) in place. Non-contiguous data is NOT_SUPPORTED; k > 137 is NOT_SUPPORTED; an empty tensor
    is SUCCESS. The result is deterministic (gather, no atomics)."""
    op = "carafe_backward"
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
    from .ops.carafe import carafe_backward as _bwd
    with torch.no_grad():
        gi, gmask = _bwd(gy, x, m, k, g, s, layout="NHWC")
    gx.copy_(gi)
    gm.copy_(gmask)
    return None
# ---------------------------------------------------------------------------------------------- psamask
def _psamask_check(op, psa_type, in_desc, out_desc, h_mask, w_mask):
    """``checkParams`` of kernels/psamask: in = x (dx), out = y (dy). All failures are BAD_PARAM.

    MLU-OPS also fails with NOT_SUPPORTED when one row does not fit its on-chip NRAM (``findLimit``);
    that limit belongs to the MLU, and cvops handles any channel count. Unlike MLU-OPS, an unknown
    ``psa_type`` is BAD_PARAM rather than a silent no-op (decisions.md).
    """
    from .ops.psamask.checks import psa_type_code
    psa_type_code(psa_type)
    for name, desc in (("input desc", in_desc), ("output desc", out_desc)):
        check_descriptor(op, name, desc)
        require(desc.dim == 4, op, f"{name} must be 4-D, got {desc.dim}-D")
        require(desc.layout == Layout.NHWC, op, f"{name} layout must be NHWC, got {desc.layout.name}")
        require(desc.dtype == DataType.FLOAT, op, f"{name} dtype must be FLOAT, got {desc.dtype.name}")
    require(in_desc.shape[:3] == out_desc.shape[:3], op,
            f"N, H, W of input {in_desc.shape[:3]} and output {out_desc.shape[:3]} must match")
    require(h_mask * w_mask == in_desc.shape[3], op,
            f"input channels ({in_desc.shape[3]}) must equal h_mask * w_mask ({h_mask * w_mask})")
    require(out_desc.shape[1] * out_desc.shape[2] == out_desc.shape[3], op,
            f"output channels ({out_desc.shape[3]}) must equal h_feature * w_feature")


@returns_status
def psamask_forward(handle, psa_type, x_desc, x, h_mask, w_mask, y_desc, y):
    """``mluOpPsamaskForward``: x ``[N, H, W, h_mask*w_mask]`` NHWC float -> y ``[N, H, W, H*W]``."""
    from .ops.psamask import psamask_forward as run
    op = "mluOpPsamaskForward"
    try:
        _psamask_check(op, psa_type, x_desc, y_desc, h_mask, w_mask)
    except NotImplementedError as err:  # the caller remaps every checkParams failure to BAD_PARAM
        raise BadParamError(op, str(err)) from err
    if x_desc.numel == 0:
        return Status.SUCCESS
    x, y = check_data(op, "x", x_desc, x), check_data(op, "y", y_desc, y)
    y.copy_(run(x, psa_type, (h_mask, w_mask), layout="NHWC"))


@returns_status
def psamask_backward(handle, psa_type, dy_desc, dy, h_mask, w_mask, dx_desc, dx):
    """``mluOpPsamaskBackward``: dy ``[N, H, W, H*W]`` NHWC float -> dx ``[N, H, W, h_mask*w_mask]``."""
    from .ops.psamask import psamask_backward as run
    op = "mluOpPsamaskBackward"
    try:
        _psamask_check(op, psa_type, dx_desc, dy_desc, h_mask, w_mask)
    except NotImplementedError as err:
        raise BadParamError(op, str(err)) from err
    if dy_desc.numel == 0:
        return Status.SUCCESS
    dy, dx = check_data(op, "dy", dy_desc, dy), check_data(op, "dx", dx_desc, dx)
    dx.copy_(run(dy, psa_type, (h_mask, w_mask), layout="NHWC"))
