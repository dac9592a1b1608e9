"""Position-sensitive RoI average pooling (R-FCN) with ``mapping_channel``, and its backward.

Numerics follow R-FCN (semantics.md §3): RoI corners are rounded half away from zero *before* scaling,
the end is inclusive (+1), the RoI is at least 0.1 wide/high, bins are clamped to [0, H] / [0, W], an
empty bin gives 0, and ``mapping_channel`` (the input channel each output read) is always written.
Output ``(ctop, ph, pw)`` reads input channel ``(ctop*PH + ph)*PW + pw``. (The MLU kernel floors instead
of rounding and torchvision uses another convention; neither is followed.)
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..._core.dispatch import backend_module
from ..._core.errors import NotSupportedError
from ..._core.layout import as_nchw, from_nchw, parse_layout
from ..._core.validate import require
from . import checks, cpu

__all__ = ["psroi_pool", "psroi_pool_backward"]


def _impl(backend: Optional[str], device: torch.device, op: str):
    return backend_module(__package__, op, backend, device)


def _pooled_shape(layout: str, r: int, od: int, ph: int, pw: int) -> tuple[int, ...]:
    return (r, od, ph, pw) if layout == "NCHW" else (r, ph, pw, od)


def _forward_impl(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
                  spatial_scale: float, output_dim: int, layout: str,
                  backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_nchw(as_nchw(input, layout), rois, pooled_height, pooled_width, spatial_scale, output_dim, layout,
                         backend)


def _forward_nchw(x: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int, spatial_scale: float,
                  output_dim: int, layout: str, backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward from the logical NCHW view ``x`` of the input; results in ``layout``."""
    fused = cpu.fused_forward(x, rois) if backend is None or backend == "cpu" else None
    if fused is not None:  # returns the stored tensors: no views to undo (the doc's cases take ~0.1 ms)
        return fused.forward(x, rois, pooled_height, pooled_width, spatial_scale, output_dim, layout)
    impl = _impl(backend, x.device, checks.OP)
    output, mapping = impl.forward(x, rois, pooled_height, pooled_width, spatial_scale, output_dim, layout)
    return from_nchw(output, layout), from_nchw(mapping, layout)


_forward_op = torch.library.custom_op("cvops::psroi_pool_forward", _forward_impl, mutates_args=())


@_forward_op.register_fake
def _(input, rois, pooled_height, pooled_width, spatial_scale, output_dim, layout, backend):
    shape = _pooled_shape(layout, rois.shape[0], output_dim, pooled_height, pooled_width)
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int32)


def _backward_impl(top_grad: torch.Tensor, rois: torch.Tensor, mapping_channel: torch.Tensor,
                   spatial_scale: float, output_dim: int, input_shape: Sequence[int], layout: str,
                   backend: Optional[str], trusted_mapping: bool = False) -> torch.Tensor:
    return _backward_nchw(as_nchw(top_grad, layout), rois, as_nchw(mapping_channel, layout), spatial_scale,
                          output_dim, _nchw_shape(tuple(input_shape), layout), layout, backend, trusted_mapping)


def _backward_nchw(top: torch.Tensor, rois: torch.Tensor, mapping: torch.Tensor, spatial_scale: float,
                   output_dim: int, shape_nchw: tuple[int, ...], layout: str, backend: Optional[str],
                   trusted_mapping: bool) -> torch.Tensor:
    """The backward from logical NCHW views of top_grad and mapping_channel; bottom_grad in ``layout``."""
    fused = cpu.fused_backward(top, rois, mapping, shape_nchw) if backend is None or backend == "cpu" else None
    if fused is not None:  # returns the stored tensor
        return fused.backward(top, rois, mapping, spatial_scale, output_dim, shape_nchw, layout, trusted_mapping)
    impl = _impl(backend, top.device, checks.OP_BACKWARD)
    bottom = impl.backward(top, rois, mapping, spatial_scale, output_dim, shape_nchw, layout, trusted_mapping)
    return from_nchw(bottom, layout)


_backward_op = torch.library.custom_op("cvops::psroi_pool_backward", _backward_impl, mutates_args=())


@_backward_op.register_fake
def _(top_grad, rois, mapping_channel, spatial_scale, output_dim, input_shape, layout, backend, trusted_mapping=False):
    return top_grad.new_empty(tuple(input_shape))


def _setup_context(ctx, inputs, output):
    input, rois, _ph, _pw, spatial_scale, output_dim, layout, backend = inputs
    _, mapping = output
    ctx.save_for_backward(rois, mapping)
    ctx.spatial_scale, ctx.output_dim, ctx.layout, ctx.backend = spatial_scale, output_dim, layout, backend
    ctx.input_shape = tuple(input.shape)


def _backward(ctx, grad_output, _grad_mapping):
    rois, mapping = ctx.saved_tensors
    grad_input = None
    if ctx.needs_input_grad[0]:
        grad_input = _backward_op(grad_output.contiguous() if ctx.layout == "NCHW" else grad_output, rois, mapping,
                                  ctx.spatial_scale, ctx.output_dim, list(ctx.input_shape), ctx.layout, ctx.backend,
                                  True)  # the forward's own mapping: no range/form check needed
    return grad_input, None, None, None, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def _setup_backward_context(ctx, inputs, output):
    top_grad, rois, mapping, spatial_scale, output_dim, _shape, layout, backend, trusted = inputs
    ctx.save_for_backward(rois, mapping)
    ctx.pooled = tuple(top_grad.shape[2:4]) if layout == "NCHW" else tuple(top_grad.shape[1:3])
    ctx.spatial_scale, ctx.output_dim, ctx.layout, ctx.backend, ctx.trusted = (spatial_scale, output_dim, layout,
                                                                               backend, trusted)


def _backward_backward(ctx, grad_bottom):
    """The backward is linear in top_grad; its adjoint is the forward pooling (for the forward's mapping)."""
    rois, mapping = ctx.saved_tensors
    if not ctx.trusted and not _forward_mapping(mapping, ctx.layout):
        raise NotSupportedError(checks.OP_BACKWARD, "double backward needs the forward's mapping_channel")
    ph, pw = ctx.pooled
    grad_top, _ = _forward_op(grad_bottom.contiguous(), rois, ph, pw, ctx.spatial_scale, ctx.output_dim,
                              ctx.layout, ctx.backend)
    return grad_top, None, None, None, None, None, None, None, None


def _forward_mapping(mapping: torch.Tensor, layout: str) -> bool:
    from .cpu import _is_canonical
    return _is_canonical(as_nchw(mapping, layout))


_backward_op.register_autograd(_backward_backward, setup_context=_setup_backward_context)


def _eager_call_ok(*tensors: torch.Tensor) -> bool:
    """Whether a call may skip the torch.library op and run the implementation directly: plain CPU tensors,
    nothing for autograd to record, no autocast, no tracing (torch.compile / export / jit.trace), no functorch transform and no
    dispatch mode. The op's own dispatch costs ~20-40 us, a large share of the doc's network cases; the
    result is the same tensors either way."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.is_autocast_enabled("cpu"):
        return False  # autocast: the op's autocast kernel applies the mixed-precision policy
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or not t.is_cpu or (grad and t.requires_grad):  # is_cpu: no device object
            return False
    try:
        return torch._C._len_torch_dispatch_stack() == 0 and not torch._C._are_functorch_transforms_active()
    except AttributeError:  # private API moved: take the op's path
        return False


def _nchw_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    if layout == "NHWC" and len(shape) == 4:
        n, h, w, c = shape
        return (n, c, h, w)
    return shape


def psroi_pool(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
               spatial_scale: float, group_size: int, output_dim: int, layout: str = "NCHW",
               backend: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Position-sensitive RoI average pooling (R-FCN).

    Args:
        input: ``[N, C, H, W]`` (``layout="NCHW"``) or ``[N, H, W, C]`` (``"NHWC"``), float16/bfloat16/
            float32/float64, with ``C == output_dim * pooled_height * pooled_width``.
        rois: ``[R, 5]`` rows ``(batch_index, x1, y1, x2, y2)`` in input-image coordinates, floating point;
            ``0 <= int(batch_index) < N``.
        pooled_height, pooled_width: output bins per RoI (PH, PW).
        spatial_scale: factor from image to feature coordinates (> 0).
        group_size: the R-FCN group size; must equal PH when PH == PW (R-FCN, MLU-OPS). With PH != PW
            the channel grid is (PH, PW) and group_size is not used beyond being a positive int.
        output_dim: output channels.
        layout: layout of ``input`` and of the returned tensors.
        backend: ``None`` (triton on CUDA, torch otherwise), ``"reference"``, ``"cpu"`` or ``"triton"``.

    Returns:
        ``(output, mapping_channel)``, each ``[R, output_dim, PH, PW]`` (NCHW) or ``[R, PH, PW, output_dim]``
        (NHWC); output has the input dtype (sums accumulate in at least fp32), mapping_channel is int32,
        the input channel each output averaged. Differentiable w.r.t. ``input``.
    """
    layout = parse_layout(checks.OP, layout)
    is_4d = isinstance(input, torch.Tensor) and input.dim() == 4  # otherwise the checks name the problem
    x_nchw = as_nchw(input, layout) if is_4d else input
    checks.check_forward(x_nchw, rois, pooled_height, pooled_width, spatial_scale, group_size, output_dim)
    args = (rois, int(pooled_height), int(pooled_width), float(spatial_scale), int(output_dim), layout, backend)
    if _eager_call_ok(input, rois):
        return _forward_nchw(x_nchw, *args)
    return _forward_op(input, *args)


def psroi_pool_backward(top_grad: torch.Tensor, rois: torch.Tensor, mapping_channel: torch.Tensor,
                        spatial_scale: float, output_dim: int, input_shape: Sequence[int], layout: str = "NCHW",
                        backend: Optional[str] = None) -> torch.Tensor:
    """Gradient of :func:`psroi_pool` w.r.t. its input (the MLU-OPS ``psroipool_backward``).

    Every top element adds ``top_grad / bin_area`` to each pixel of its bin in input channel
    ``mapping_channel``; empty bins add nothing. Deterministic (no order-dependent atomics).

    Args:
        top_grad: ``[R, output_dim, PH, PW]`` (NCHW) or ``[R, PH, PW, output_dim]`` (NHWC), floating point.
        rois: ``[R, 5]`` as in :func:`psroi_pool`.
        mapping_channel: int32/int64, the shape of ``top_grad``, values in ``[0, C)``.
        spatial_scale, output_dim: as in the forward.
        input_shape: shape of the returned gradient in ``layout``: ``(N, C, H, W)`` or ``(N, H, W, C)``,
            with ``C == output_dim * PH * PW``.
    Returns:
        bottom_grad of ``input_shape``, dtype of ``top_grad``.
    """
    layout = parse_layout(checks.OP_BACKWARD, layout)
    if not isinstance(input_shape, (list, tuple, torch.Size)):  # the message is built only on failure
        require(False, checks.OP_BACKWARD, f"input_shape must be a sequence of 4 ints, got {input_shape!r}")
    shape = tuple(int(s) if isinstance(s, (torch.SymInt, torch.Tensor)) else s for s in input_shape)
    dims_ok = all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (top_grad, mapping_channel))
    top_nchw = as_nchw(top_grad, layout) if dims_ok else top_grad
    map_nchw = as_nchw(mapping_channel, layout) if dims_ok else mapping_channel
    shape_nchw = _nchw_shape(shape, layout)
    checks.check_backward(top_nchw, rois, map_nchw, spatial_scale, output_dim, shape_nchw)
    if _eager_call_ok(top_grad, rois, mapping_channel):
        return _backward_nchw(top_nchw, rois, map_nchw, float(spatial_scale), int(output_dim), shape_nchw, layout,
                              backend, False)
    return _backward_op(top_grad, rois, mapping_channel, float(spatial_scale), int(output_dim), list(shape), layout,
                        backend)
