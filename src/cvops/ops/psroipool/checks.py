"""Parameter checks of psroipool (design doc 1.4 and 3.7, semantics.md §3).

Shared by the functional API (exceptions) and the MLU-OPS-style layer (statuses). Shapes here are
logical NCHW: input ``[N, C, H, W]``, rois ``[R, 5]``, output / mapping_channel ``[R, output_dim, PH, PW]``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

import torch

from ..._core.bits import numpy_alias
from ..._core.sync import check_values
from ..._core.validate import FLOAT_DTYPES, INDEX_DTYPES, check_int, check_same_device, check_tensor, require

OP = "psroi_pool"
OP_BACKWARD = "psroi_pool_backward"


def check_pool_params(op: str, pooled_height, pooled_width, spatial_scale, output_dim,
                      group_size=None) -> tuple[int, int, float, int]:
    """pooled sizes >= 1, spatial_scale > 0 (finite), output_dim >= 1, group_size >= 1.

    group_size must equal pooled_height when PH == PW (R-FCN/MLU-OPS: each bin reads its own
    channel group). With PH != PW the channel grid is (PH, PW), torchvision's convention, and
    group_size only has to be a positive int.
    """
    ph = check_int(op, "pooled_height", pooled_height, min_value=1)
    pw = check_int(op, "pooled_width", pooled_width, min_value=1)
    od = check_int(op, "output_dim", output_dim, min_value=1)
    if isinstance(spatial_scale, torch.Tensor) and spatial_scale.dim() == 0 and spatial_scale.is_floating_point():
        spatial_scale = float(spatial_scale)
    if type(spatial_scale) is not float and not (isinstance(spatial_scale, numbers.Real)
                                                 and not isinstance(spatial_scale, bool)):
        raise_bad(op, f"spatial_scale must be a float, got {spatial_scale!r}")
    scale = float(spatial_scale)
    if not (0 < scale < math.inf):
        raise_bad(op, f"spatial_scale must be > 0 and finite, got {scale}")
    if group_size is not None:
        g = check_int(op, "group_size", group_size, min_value=1)
        if ph == pw and g != ph:
            raise_bad(op, f"group_size ({g}) must equal pooled_height == pooled_width ({ph})")
    return ph, pw, scale, od


CONVENTIONS = ("rfcn", "torchvision")


def check_convention(op: str, convention) -> str:
    """``"rfcn"`` (R-FCN / MLU-OPS bin arithmetic) or ``"torchvision"`` (torchvision.ops.ps_roi_pool's)."""
    if convention not in CONVENTIONS:
        raise_bad(op, f"convention must be 'rfcn' or 'torchvision', got {convention!r}")
    return convention


def check_rois(op: str, rois) -> None:
    check_tensor(op, "rois", rois, dim=2, dtypes=FLOAT_DTYPES)
    if rois.shape[1] != 5:
        raise_bad(op, f"rois must be [R, 5] (batch_index, x1, y1, x2, y2), got {tuple(rois.shape)}")


def check_forward(input_nchw: torch.Tensor, rois: torch.Tensor, pooled_height, pooled_width, spatial_scale,
                  group_size, output_dim) -> tuple[int, int, float, int]:
    """Everything but the data-dependent batch-index range (see :func:`check_batch_indices`)."""
    ph, pw, scale, od = check_pool_params(OP, pooled_height, pooled_width, spatial_scale, output_dim, group_size)
    check_tensor(OP, "input", input_nchw, dim=4, dtypes=FLOAT_DTYPES)
    check_rois(OP, rois)
    check_same_device(OP, input=input_nchw, rois=rois)
    _check_channels(OP, input_nchw.shape[1], ph, pw, od)
    if input_nchw.numel() > 0:  # the doc: an empty input returns at once, before the rois check
        require(rois.shape[0] > 0, OP, "rois must not be empty (R = 0)")
    return ph, pw, scale, od


def _check_channels(op: str, c: int, ph: int, pw: int, od: int) -> None:
    if c != od * ph * pw:
        raise_bad(op, f"input channels ({c}) must equal pooled_height * pooled_width * output_dim "
                      f"({ph}*{pw}*{od}={ph * pw * od})")


def check_backward(top_grad_nchw: torch.Tensor, rois: torch.Tensor, mapping_channel_nchw: torch.Tensor,
                   spatial_scale, output_dim, input_shape_nchw) -> tuple[int, int, float, int]:
    check_tensor(OP_BACKWARD, "top_grad", top_grad_nchw, dim=4, dtypes=FLOAT_DTYPES)
    top_shape = tuple(top_grad_nchw.shape)
    r, top_channels, ph, pw = top_shape
    if ph < 1 or pw < 1:
        raise_bad(OP_BACKWARD, f"top_grad pooled sizes must be >= 1, got {top_shape}")
    _, _, scale, od = check_pool_params(OP_BACKWARD, ph, pw, spatial_scale, output_dim)
    check_rois(OP_BACKWARD, rois)
    require(rois.shape[0] > 0, OP_BACKWARD, "rois must not be empty (R = 0)")
    check_tensor(OP_BACKWARD, "mapping_channel", mapping_channel_nchw, dim=4, dtypes=INDEX_DTYPES)
    check_same_device(OP_BACKWARD, top_grad=top_grad_nchw, rois=rois, mapping_channel=mapping_channel_nchw)
    if top_channels != od:
        raise_bad(OP_BACKWARD, f"top_grad channels ({top_channels}) must equal output_dim ({od})")
    if r != rois.shape[0]:
        raise_bad(OP_BACKWARD, f"top_grad rois ({r}) must equal rois.shape[0] ({rois.shape[0]})")
    if tuple(mapping_channel_nchw.shape) != top_shape:
        raise_bad(OP_BACKWARD, f"mapping_channel shape {tuple(mapping_channel_nchw.shape)} must equal top_grad "
                               f"shape {top_shape}")
    if not (len(input_shape_nchw) == 4 and all(isinstance(s, int) and s >= 0 for s in input_shape_nchw)):
        raise_bad(OP_BACKWARD, f"input_shape must be 4 non-negative ints, got {input_shape_nchw!r}")
    _check_channels(OP_BACKWARD, input_shape_nchw[1], ph, pw, od)
    return ph, pw, scale, od


def check_roi_values(op: str, rois: torch.Tensor, batch: int) -> None:
    """Every RoI has a batch index with ``0 <= int(b) < N`` (C truncation, also when N == 0) and finite
    corners: a NaN or inf coordinate has no bin edges (R-FCN would read out of bounds; cvops raises).

    Data-dependent, so it runs once per call at the implementation entry (real tensors only), for every
    backend; no kernel repeats it. On CUDA it is an asynchronous device assertion (no host sync,
    ``_core.sync``); elsewhere it raises :class:`BadParamError` naming the first bad entry."""
    if rois.shape[0] == 0:
        return
    check_values(rois, lambda: _check_roi_values_on_host(op, rois, batch), lambda: _roi_values_ok(rois, batch),
                 f"{op}: rois must hold batch indices in [0, N) (N = {batch}) and finite corners")


def _roi_values_ok(rois: torch.Tensor, batch: int) -> torch.Tensor:
    b = rois[:, 0]
    return ((b > -1) & (b < batch)).all() & torch.isfinite(rois[:, 1:5]).all()


def _check_roi_values_on_host(op: str, rois: torch.Tensor, batch: int) -> None:
    """CPU rois are checked through numpy (a few microseconds for any R); a failure, and other host-readable
    devices, through torch."""
    if rois.is_cpu:
        r = rois.detach()
        r = numpy_alias(r if r.dtype in (torch.float32, torch.float64) else r.float())
        if r[:, 0].min() > -1 and r[:, 0].max() < batch and np.isfinite(r[:, 1:5]).all():  # NaN fails compares
            return
    bad_batch = ~((rois[:, 0] > -1) & (rois[:, 0] < batch)).cpu()  # NaN fails both comparisons
    bad_coord = ~torch.isfinite(rois[:, 1:5]).cpu()
    if bad_batch.any():
        i = int(bad_batch.nonzero()[0, 0])
        where = f"[0, {batch - 1}]" if batch > 0 else "[] (the input has no images, N = 0)"
        raise_bad(op, f"rois[{i}, 0] = {float(rois[i, 0])} is not a batch index in {where} (N = {batch})")
    if bad_coord.any():
        i, j = (int(v) for v in bad_coord.nonzero()[0])
        raise_bad(op, f"rois[{i}, {j + 1}] = {float(rois[i, j + 1])} is not a finite coordinate "
                      "(x1, y1, x2, y2 must be finite)")


def check_mapping_values(op: str, mapping_channel: torch.Tensor, channels: int) -> None:
    """Every mapping_channel entry must address an input channel (data-dependent)."""
    if mapping_channel.numel() == 0:
        return
    lo, hi = torch.aminmax(mapping_channel)
    if int(lo) < 0 or int(hi) >= channels:
        v = int(lo) if int(lo) < 0 else int(hi)
        raise_bad(op, f"mapping_channel holds {v}, outside the input channels [0, {channels - 1}]")


def raise_bad(op: str, message: str) -> None:
    require(False, op, message)
