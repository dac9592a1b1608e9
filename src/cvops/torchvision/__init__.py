"""Drop-in for ``torchvision.ops``' position-sensitive RoI pooling (``ps_roi_pool``, ``PSRoIPool``): its
names, signatures, return types and numerics, on :func:`cvops.psroi_pool` with ``convention="torchvision"``.

Numerics are torchvision's forward kernel's (corners rounded half away from zero, no +1, a RoI at least
1 x 1, bin edges ``floor``/``ceil`` clamped to the map, an empty bin 0, output channel ``c`` of bin
``(ph, pw)`` from input channel ``(c*PH + ph)*PW + pw``); the gradient is that forward's exact adjoint
(torchvision's backward also credits the last row and column, which its forward never reads). Unlike
torchvision: a batch index outside [0, N) or a non-finite corner raises, every float dtype runs on CPU and
CUDA, and an empty list of boxes gives an empty output. Bad arguments raise ``cvops.BadParamError`` that is
also torchvision's exception (``AssertionError`` for the boxes' shape, ``RuntimeError`` for the rest, a
float ``output_size`` included). The module works under ``torch.jit.script``, ``torch.fx``,
``torch.export`` and ``torch.compile``: the pooling is the custom op ``torch.ops.cvops.psroi_pool_forward``.
"""
import operator
from typing import List, Union

import torch
from torch import Tensor, nn
from torch.jit.annotations import BroadcastingList2
from torch.nn.modules.utils import _pair

__all__ = ["ps_roi_pool", "PSRoIPool"]


@torch.jit.ignore
def _pool(input: Tensor, boxes: Union[Tensor, List[Tensor]], output_size: List[int], spatial_scale: float) -> Tensor:
    """The checks (boxes as ``Tensor[K, 5]`` or a list of ``Tensor[L, 4]``, channels a multiple of PH*PW), then
    cvops' op in the torchvision convention."""
    from .. import psroi_pool
    from .._core.errors import raising_also
    from .._core.validate import require
    from ..nn import _rois_from_boxes
    op = "ps_roi_pool"
    with raising_also(AssertionError):  # torchvision asserts the boxes' shape (torch._assert)
        rois = _rois_from_boxes(boxes, op)
        require(isinstance(rois, Tensor) and rois.dim() == 2 and rois.shape[1] == 5, op,
                f"boxes must be a Tensor[K, 5] or a list of Tensor[L, 4], got shape {tuple(rois.shape)}")
    with raising_also(RuntimeError):  # and checks the rest in its kernel (TORCH_CHECK)
        ph, pw = _output_size(output_size, op)
        require(isinstance(input, Tensor) and input.dim() == 4, op, "input must be a 4-D Tensor[N, C, H, W]")
        c = input.shape[1]
        require(c % (ph * pw) == 0, op, f"input channels ({c}) must be a multiple of output_size[0] * "
                                        f"output_size[1] ({ph * pw})")
        if rois.shape[0] == 0:  # no boxes: an empty output, as torchvision's (cvops.psroi_pool needs R >= 1)
            empty = input.new_zeros((0, c // (ph * pw), ph, pw))
            return empty + input.narrow(0, 0, 0).sum() if input.requires_grad else empty  # (a zero gradient)
        return psroi_pool(input, rois, ph, pw, float(spatial_scale), ph if ph == pw else 1, c // (ph * pw),
                          convention="torchvision")[0]


def _output_size(output_size, op: str):
    """``(height, width)`` as positive Python ints; a float (even 3.0) is an error, as torchvision's op takes
    ints only (no silent truncation of 2.5)."""
    from .._core.validate import require
    try:
        sizes = [operator.index(v) for v in output_size]
    except TypeError:
        sizes = []
    require(len(sizes) == 2, op, f"output_size must be an int or a pair of ints, got {output_size!r}")
    require(sizes[0] >= 1 and sizes[1] >= 1, op, f"output_size must be positive, got {tuple(sizes)}")
    return sizes[0], sizes[1]


@torch.fx.wrap
def ps_roi_pool(input: Tensor, boxes: Union[Tensor, List[Tensor]], output_size: BroadcastingList2[int],
                spatial_scale: float = 1.0) -> Tensor:
    """Position-sensitive RoI pooling (R-FCN), torchvision's ``ps_roi_pool``: ``input [N, C, H, W]`` with
    ``C`` a multiple of ``PH * PW``, ``boxes`` a ``Tensor[K, 5]`` of ``(batch_index, x1, y1, x2, y2)`` or a
    list of per-image ``Tensor[L, 4]`` -> ``Tensor[K, C / (PH * PW), PH, PW]``."""
    return _pool(input, boxes, _pair(output_size), spatial_scale)


class PSRoIPool(nn.Module):
    """torchvision's ``PSRoIPool``: see :func:`ps_roi_pool`."""

    def __init__(self, output_size: BroadcastingList2[int], spatial_scale: float):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return ps_roi_pool(input, rois, self.output_size, self.spatial_scale)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(output_size={self.output_size}, spatial_scale={self.spatial_scale})"
