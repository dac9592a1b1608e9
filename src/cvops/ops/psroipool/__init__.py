"""Position-sensitive RoI average pooling (R-FCN) with ``mapping_channel``, and its backward.

Two conventions turn a RoI into bins; everything after the bin edges is shared. Output ``(ctop, ph, pw)``
reads input channel ``(ctop*PH + ph)*PW + pw``, an empty bin gives 0, and ``mapping_channel`` (the input
channel each output read) is always written.

* ``"rfcn"`` (default; R-FCN, MLU-OPS' CPU reference, semantics.md §3): corners rounded half away from zero
  *before* scaling, the end inclusive (+1), the RoI at least 0.1 wide/high, bin ``p`` spans
  ``floor(p*bin + start)`` to ``ceil((p+1)*bin + start)`` clamped to [0, H] / [0, W]; arithmetic in float32
  (float64 for float64 input). The MLU kernel floors instead of rounding; that is not followed.
* ``"torchvision"`` (``torchvision.ops.ps_roi_pool``): the *scaled* corners rounded half away from zero, no +1,
  the RoI at least 1 wide/high, bin ``p`` spans ``floor(p*bin) + start`` to ``ceil((p+1)*bin) + start`` with
  ``bin = size / pooled`` in the input dtype (float32 for float16/bfloat16), clamped to [0, H - 1] /
  [0, W - 1] as torchvision's forward clamps (its last row and column are never read). The backward is the
  exact adjoint of that forward (torchvision's own backward clamps to [0, H] and so is not).

RoI corners must be finite and batch indices in [0, N): anything else raises BadParamError naming ``rois``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..._core.dispatch import backend_module, check_backend
from ..._core.errors import NotSupportedError
from ..._core.layout import as_nchw, from_nchw, nchw_shape, parse_layout, stored_shape
from ..._core.opdef import custom_op
from ..._core.validate import require
from . import checks

__all__ = ["psroi_pool", "psroi_pool_backward"]


def _forward(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int, spatial_scale: float,
             output_dim: int, layout: str, backend: Optional[str],
             convention: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward on real tensors: the one check of the RoI values (batch indices, finite corners), then the
    backend, which works on the logical NCHW view of the input; results in ``layout``."""
    x = as_nchw(input, layout)
    checks.check_roi_values(checks.OP, rois, x.shape[0])
    impl = backend_module(__package__, checks.OP, backend, x.device, input, rois)
    output, mapping = impl.forward(x, rois, pooled_height, pooled_width, spatial_scale, output_dim, layout, convention)
    return from_nchw(output, layout), from_nchw(mapping, layout)


def _forward_fake(input, rois, pooled_height, pooled_width, spatial_scale, output_dim, layout, backend, convention):
    shape = stored_shape((rois.shape[0], output_dim, pooled_height, pooled_width), layout)
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int32)


def _forward_grad(s, grad_output, _grad_mapping):
    if not s.needs_input_grad[0]:
        return None
    (mapping,) = s.outputs  # the forward's own mapping: no range/form check needed
    return _backward_op(grad_output, s.rois, mapping, s.spatial_scale, s.output_dim, list(s.input), s.layout,
                        s.backend, s.convention, True)


def _backward(top_grad: torch.Tensor, rois: torch.Tensor, mapping_channel: torch.Tensor, spatial_scale: float,
              output_dim: int, input_shape: Sequence[int], layout: str, backend: Optional[str], convention: str,
              trusted_mapping: bool = False) -> torch.Tensor:
    """The backward on real tensors: the RoI values are checked here once, as in the forward (not when autograd
    calls it: the forward checked them, and autograd saved them unchanged)."""
    shape = nchw_shape(input_shape, layout)
    if not trusted_mapping:
        checks.check_roi_values(checks.OP_BACKWARD, rois, shape[0])
    impl = backend_module(__package__, checks.OP_BACKWARD, backend, top_grad.device, top_grad, rois,
                          mapping_channel)
    bottom = impl.backward(as_nchw(top_grad, layout), rois, as_nchw(mapping_channel, layout), spatial_scale,
                           output_dim, shape, layout, trusted_mapping, convention)
    return from_nchw(bottom, layout)


def _backward_fake(top_grad, rois, mapping_channel, spatial_scale, output_dim, input_shape, *_):
    return top_grad.new_empty(tuple(input_shape))


def _backward_grad(s, grad_bottom):
    """The backward is linear in top_grad; its adjoint is the forward pooling (for the forward's mapping)."""
    from .cpu import _is_canonical
    if not s.trusted_mapping and not _is_canonical(as_nchw(s.mapping_channel, s.layout)):
        raise NotSupportedError(checks.OP_BACKWARD, "double backward needs the forward's mapping_channel")
    _, _, ph, pw = nchw_shape(s.top_grad, s.layout)
    grad_top, _ = _forward_op(grad_bottom, s.rois, ph, pw, s.spatial_scale, s.output_dim, s.layout, s.backend,
                              s.convention)
    return grad_top


_forward_op = custom_op("psroi_pool_forward", _forward, _forward_fake, backward=_forward_grad, save=("rois",),
                        save_outputs=(1,))
_backward_op = custom_op("psroi_pool_backward", _backward, _backward_fake, backward=_backward_grad,
                         save=("rois", "mapping_channel"))


def psroi_pool(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
               spatial_scale: float, group_size: int, output_dim: int, layout: str = "NCHW",
               backend: Optional[str] = None, convention: str = "rfcn") -> tuple[torch.Tensor, torch.Tensor]:
    """Position-sensitive RoI average pooling (R-FCN's numerics by default, or torchvision's).

    Args:
        input: ``[N, C, H, W]`` (``layout="NCHW"``) or ``[N, H, W, C]`` (``"NHWC"``), float16/bfloat16/
            float32/float64, with ``C == output_dim * pooled_height * pooled_width``.
        rois: ``[R, 5]`` rows ``(batch_index, x1, y1, x2, y2)`` in input-image coordinates, floating point;
            ``0 <= int(batch_index) < N`` (so no RoI is valid when N == 0) and finite corners: a NaN or inf
            coordinate raises BadParamError naming ``rois``.
        pooled_height, pooled_width: output bins per RoI (PH, PW).
        spatial_scale: factor from image to feature coordinates (> 0).
        group_size: the R-FCN group size; must equal PH when PH == PW (R-FCN, MLU-OPS). With PH != PW
            the channel grid is (PH, PW) and group_size is not used beyond being a positive int.
        output_dim: output channels.
        layout: layout of ``input`` and of the returned tensors.
        backend: ``None`` (the device's default), ``"reference"``, ``"torch"``, ``"numba"`` or ``"triton"``;
            ``"cpu"`` still means the CPU default.
        convention: how a RoI becomes bins (see the module docstring): ``"rfcn"`` (R-FCN, MLU-OPS) or
            ``"torchvision"`` (``torchvision.ops.ps_roi_pool``).

    Returns:
        ``(output, mapping_channel)``, each ``[R, output_dim, PH, PW]`` (NCHW) or ``[R, PH, PW, output_dim]``
        (NHWC); output has the input dtype (sums accumulate in at least fp32), mapping_channel is int32,
        the input channel each output averaged. Differentiable w.r.t. ``input``.
    """
    layout = parse_layout(checks.OP, layout)
    is_4d = isinstance(input, torch.Tensor) and input.dim() == 4  # otherwise the checks name the problem
    x_nchw = as_nchw(input, layout) if is_4d else input
    checks.check_forward(x_nchw, rois, pooled_height, pooled_width, spatial_scale, group_size, output_dim)
    convention = checks.check_convention(checks.OP, convention)
    check_backend(__package__, checks.OP, backend, input.device, input, rois)
    return _forward_op(input, rois, int(pooled_height), int(pooled_width), float(spatial_scale), int(output_dim),
                       layout, backend, convention)


def psroi_pool_backward(top_grad: torch.Tensor, rois: torch.Tensor, mapping_channel: torch.Tensor,
                        spatial_scale: float, output_dim: int, input_shape: Sequence[int], layout: str = "NCHW",
                        backend: Optional[str] = None, convention: str = "rfcn") -> torch.Tensor:
    """Gradient of :func:`psroi_pool` w.r.t. its input (the MLU-OPS ``psroipool_backward``).

    Every top element adds ``top_grad / bin_area`` to each pixel of its bin in input channel
    ``mapping_channel``; empty bins add nothing. Deterministic (no order-dependent atomics).

    Args:
        top_grad: ``[R, output_dim, PH, PW]`` (NCHW) or ``[R, PH, PW, output_dim]`` (NHWC), floating point.
        rois: ``[R, 5]`` as in :func:`psroi_pool` (batch indices in ``[0, N)``, finite corners).
        mapping_channel: int32/int64, the shape of ``top_grad``, values in ``[0, C)``.
        spatial_scale, output_dim: as in the forward.
        input_shape: shape of the returned gradient in ``layout``: ``(N, C, H, W)`` or ``(N, H, W, C)``,
            with ``C == output_dim * PH * PW``.
        convention: the forward's (``"rfcn"`` or ``"torchvision"``).
        backend: as in :func:`psroi_pool`.
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
    shape_nchw = nchw_shape(shape, layout)
    checks.check_backward(top_nchw, rois, map_nchw, spatial_scale, output_dim, shape_nchw)
    convention = checks.check_convention(checks.OP_BACKWARD, convention)
    check_backend(__package__, checks.OP_BACKWARD, backend, top_grad.device, top_grad, rois,
                  mapping_channel)
    return _backward_op(top_grad, rois, mapping_channel, float(spatial_scale), int(output_dim), list(shape), layout,
                        backend, convention)
