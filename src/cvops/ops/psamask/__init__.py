"""psamask (PSANet point-wise spatial attention mask), forward and backward.

``input [N, h_mask*w_mask, H, W]`` (NCHW, mmcv) or ``[N, H, W, h_mask*w_mask]`` (NHWC, MLU-OPS) ->
``output [N, H*W, H, W]`` (or ``[N, H, W, H*W]``). COLLECT writes
``out[n, q, p] = x[n, m(q - p), p]`` for every position p and every neighbour q inside the mask
window centred at p, DISTRIBUTE writes the transpose ``out[n, p, q]``; everything else is 0. Pure data
movement: every backend is bit-exact. The backward is the exact adjoint (a gather, no accumulation).
On the CPU a call needs its output and less than 8 MiB of scratch besides its input (both paths).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..._core.dispatch import backend_module, check_backend
from ..._core.layout import as_nchw, from_nchw, nchw_shape, stored_shape
from ..._core.opdef import custom_op
from ..._core.validate import check_out
from .checks import OP, check_backward, check_forward

__all__ = ["psamask", "psamask_forward", "psamask_backward"]


def _run(direction: str, t: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str,
         backend: Optional[str], out: Optional[torch.Tensor] = None) -> torch.Tensor:
    module = backend_module(__name__, OP, backend, t.device, t)
    if t.numel() == 0:  # psamask.md 1.1: zero elements return at once
        return t.new_zeros(_result_shape(direction, t, h_mask, w_mask, layout)) if out is None else out.zero_()
    kernel = getattr(module, direction)
    if out is None:
        return from_nchw(kernel(as_nchw(t, layout), psa_type, h_mask, w_mask, layout), layout).contiguous()
    kernel(as_nchw(t, layout), psa_type, h_mask, w_mask, layout, out=as_nchw(out, layout))
    return out


def _run_into(direction: str, t: torch.Tensor, code: int, h_mask: int, w_mask: int, layout: str,
          backend: Optional[str], out: torch.Tensor) -> torch.Tensor:
    """A call with ``out=``: the kernel writes the caller's tensor, outside autograd and the custom op."""
    check_out(OP, out, _result_shape(direction, t, h_mask, w_mask, layout), t)
    return _run(direction, t, code, h_mask, w_mask, layout, backend, out)


def _result_shape(direction, t, h_mask, w_mask, layout):
    n, _, h, w = nchw_shape(t.shape, layout)
    return stored_shape((n, h * w if direction == "forward" else h_mask * w_mask, h, w), layout)


def _forward(input: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str,
             backend: Optional[str]) -> torch.Tensor:
    return _run("forward", input, psa_type, h_mask, w_mask, layout, backend)


def _backward(grad_output: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str,
              backend: Optional[str]) -> torch.Tensor:
    return _run("backward", grad_output, psa_type, h_mask, w_mask, layout, backend)


def _fake(direction):
    return lambda t, psa_type, h_mask, w_mask, layout, backend: t.new_empty(
        _result_shape(direction, t, h_mask, w_mask, layout))


# each direction's backward is the other direction: the exact adjoint, so gradients of any order flow
def _forward_grad(s, grad):
    return _backward_op(grad.contiguous(), s.psa_type, s.h_mask, s.w_mask, s.layout, s.backend)


def _backward_grad(s, grad):
    return _forward_op(grad.contiguous(), s.psa_type, s.h_mask, s.w_mask, s.layout, s.backend)


_forward_op = custom_op("psamask_forward", _forward, _fake("forward"), backward=_forward_grad)
_backward_op = custom_op("psamask_backward", _backward, _fake("backward"), backward=_backward_grad)


def psamask_forward(input: torch.Tensor, psa_type, mask_size, layout: str = "NCHW",
                    backend: Optional[str] = None, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """PSA mask forward.

    Args:
        input: ``[N, h_mask*w_mask, H, W]`` (``layout="NCHW"``) or ``[N, H, W, h_mask*w_mask]`` (``"NHWC"``),
            any floating dtype.
        psa_type: ``"collect"``/``0`` or ``"distribute"``/``1``.
        mask_size: ``h_mask`` or ``(h_mask, w_mask)``; even sizes use the window ``-(m-1)//2 .. m-1-(m-1)//2``.
        layout: storage layout of input and output.
        backend: ``None`` (the device's default), ``"reference"``, ``"torch"``, ``"numba"`` or ``"triton"`` (see
            ``cvops._core.dispatch``; ``"cpu"`` still means the CPU default).
        out: optional contiguous tensor of the result's shape, dtype and device, sharing no memory with
            ``input``, to write the result into (and return); as with torch's ``out=``, no gradient flows.
            A caller that reuses it skips a fresh output's page faults, a large part of this op's cost.

    Returns:
        ``[N, H*W, H, W]`` (NCHW) or ``[N, H, W, H*W]`` (NHWC), same dtype and device as ``input``.
    """
    code, h_mask, w_mask, layout = check_forward(input, psa_type, mask_size, layout)
    check_backend(__name__, OP, backend, input.device, input)
    if out is not None:
        return _run_into("forward", input, code, h_mask, w_mask, layout, backend, out)
    return _forward_op(input, code, h_mask, w_mask, layout, backend)


def psamask_backward(grad_output: torch.Tensor, psa_type, mask_size, layout: str = "NCHW",
                     backend: Optional[str] = None, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Gradient of :func:`psamask_forward` w.r.t. its input.

    ``grad_output [N, H*W, H, W]`` (or NHWC ``[N, H, W, H*W]``) -> ``[N, h_mask*w_mask, H, W]`` (or NHWC).
    ``backend`` and ``out``: as in :func:`psamask_forward`.
    """
    code, h_mask, w_mask, layout = check_backward(grad_output, psa_type, mask_size, layout)
    check_backend(__name__, OP, backend, grad_output.device, grad_output)
    if out is not None:
        return _run_into("backward", grad_output, code, h_mask, w_mask, layout, backend, out)
    return _backward_op(grad_output, code, h_mask, w_mask, layout, backend)


def psamask(input: torch.Tensor, psa_type, mask_size, layout: str = "NCHW",
            backend: Optional[str] = None) -> torch.Tensor:
    """Differentiable PSA mask; see :func:`psamask_forward` for shapes. Gradients flow to ``input``."""
    return psamask_forward(input, psa_type, mask_size, layout, backend)
