"""Parameter checks of get_indice_pairs (design doc 1.4, semantics.md §5, decisions.md).

``check_params`` looks only at shapes and Python parameters (safe under ``torch.compile`` tracing);
``check_index_values`` reads the data (coordinate ranges) and runs inside the op's real implementation.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..._core.parallel import single_threaded
from ..._core.validate import INDEX_DTYPES, check_int, check_tensor, pair, require

OP = "get_indice_pairs"
MAX_NDIM = 4
# Invalid (input, offset) slots carry keys >= this; every valid linear index must stay below it.
INVALID_KEY = 1 << 60
INT32_LIMIT = 1 << 31  # sizes up to this keep every coordinate (size - 1) within int32


@dataclass(frozen=True)
class Geometry:
    """Normalised parameters: one entry per spatial dimension (z, y, x for 3-D)."""

    batch_size: int
    spatial_shape: tuple[int, ...]
    out_spatial_shape: tuple[int, ...]
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    subm: bool
    transpose: bool

    @property
    def ndim(self) -> int:
        return len(self.spatial_shape)

    @property
    def kernel_volume(self) -> int:
        return math.prod(self.kernel_size)


def leading_ones(values: Sequence[int], fill: int = 1) -> list[int]:
    """``values`` with ``fill`` in front up to ``MAX_NDIM`` entries: leading size-1 dimensions (one tap
    each, adding nothing to an offset or a key), so that one loop or kernel serves every rank."""
    return [fill] * (MAX_NDIM - len(values)) + list(values)


def _shape(name: str, value, ndim: int, min_value: int) -> tuple[int, ...]:
    return pair(OP, name, value, ndim, min_value=min_value)


def conv_output_size(spatial_shape, kernel_size, stride, padding, dilation) -> list[int]:
    """``(in + 2p - d(k-1) - 1) // s + 1`` per dimension; a kernel size of -1 means global (out 1)."""
    out = [1 if k == -1 else (i + 2 * p - d * (k - 1) - 1) // s + 1
           for i, k, s, p, d in zip(spatial_shape, kernel_size, stride, padding, dilation)]
    _check_positive(out, spatial_shape, kernel_size, stride, padding, dilation)
    return out


def _check_positive(out, spatial, kernel, stride, padding, dilation) -> None:
    require(all(o >= 1 for o in out), OP,
            f"output spatial shape {list(out)} must be positive (spatial_shape {list(spatial)}, kernel_size "
            f"{list(kernel)}, stride {list(stride)}, padding {list(padding)}, dilation {list(dilation)})")


def deconv_output_size(spatial_shape, kernel_size, stride, padding, dilation, out_padding) -> list[int]:
    """``(in - 1) s - 2p + k + out_padding`` per dimension (spconv/mmcv; dilation not applied)."""
    require(-1 not in kernel_size, OP, "kernel_size -1 (global) is not defined for a transposed convolution")
    out = [(i - 1) * s - 2 * p + k + op
           for i, k, s, p, op in zip(spatial_shape, kernel_size, stride, padding, out_padding)]
    _check_positive(out, spatial_shape, kernel_size, stride, padding, dilation)
    return out


def check_params(indices, batch_size, spatial_shape, kernel_size, stride, padding, dilation,
                 out_padding=0, subm=False, transpose=False, out_spatial_shape=None) -> Geometry:
    """Every structural check; returns the normalised :class:`Geometry`."""
    check_tensor(OP, "indices", indices, dim=2, dtypes=INDEX_DTYPES)
    if (isinstance(spatial_shape, torch.Tensor) or type(spatial_shape).__module__ == "numpy") and \
            getattr(spatial_shape, "ndim", 0) == 1:
        spatial_shape = spatial_shape.tolist()  # a tensor or numpy array of sizes (spconv passes numpy)
    require(isinstance(spatial_shape, (list, tuple, torch.Size)), OP,
            f"spatial_shape must be a sequence of ints, got {spatial_shape!r}")
    ndim = len(spatial_shape)
    require(1 <= ndim <= MAX_NDIM, OP, f"spatial_shape must have 1 to {MAX_NDIM} dimensions, got {ndim}")
    require(indices.shape[1] == ndim + 1, OP,
            f"indices must be [L, NDim + 1] = [L, {ndim + 1}] rows (batch, *coords) for a {ndim}-D "
            f"spatial_shape, got shape {tuple(indices.shape)}")
    batch_size = check_int(OP, "batch_size", batch_size, min_value=1)
    spatial = _shape("spatial_shape", spatial_shape, ndim, 1)
    kernel = _shape("kernel_size", kernel_size, ndim, 1)
    stride = _shape("stride", stride, ndim, 1)
    padding = _shape("padding", padding, ndim, 0)
    dilation = _shape("dilation", dilation, ndim, 1)
    out_padding = _shape("out_padding", out_padding, ndim, 0)
    require(isinstance(subm, (bool, int)), OP, f"subm must be a bool, got {subm!r}")
    require(isinstance(transpose, (bool, int)), OP, f"transpose must be a bool, got {transpose!r}")
    subm, transpose = bool(subm), bool(transpose)
    for d, (s, dil) in enumerate(zip(stride, dilation)):
        require(s == 1 or dil == 1, OP,
                f"stride ({s}) and dilation ({dil}) of dimension {d} cannot both be > 1")
    if subm:
        require(not transpose, OP, "subm and transpose cannot both be set (a submanifold conv keeps its sites)")
        require(all(s == 1 for s in stride), OP, f"subm requires stride 1 in every dimension, got {stride}")
        if out_spatial_shape is not None:
            given = _shape("out_spatial_shape", out_spatial_shape, ndim, 1)
            require(given == spatial, OP,
                    f"subm requires out_spatial_shape {given} to equal spatial_shape {spatial}")
        out = spatial
    elif out_spatial_shape is not None:
        out = _shape("out_spatial_shape", out_spatial_shape, ndim, 1)
    else:
        out = tuple(deconv_output_size(spatial, kernel, stride, padding, dilation, out_padding) if transpose
                    else conv_output_size(spatial, kernel, stride, padding, dilation))
    # coordinates and batch indices are written to int32 outputs: every value must fit (no silent wrap)
    require(batch_size <= INT32_LIMIT, OP,
            f"batch_size ({batch_size}) must be <= 2**31: batch indices must fit the int32 outputs")
    for name, shape in (("spatial_shape", spatial), ("out_spatial_shape", out)):
        for d, size in enumerate(shape):
            require(size <= INT32_LIMIT, OP,
                    f"{name}[{d}] ({size}) must be <= 2**31: coordinates must fit the int32 outputs")
    require(batch_size * math.prod(out) < INVALID_KEY and batch_size * math.prod(spatial) < INVALID_KEY, OP,
            "batch_size * prod(spatial shape) must be below 2^60")
    return Geometry(batch_size, spatial, tuple(out), kernel, stride, padding, dilation, subm, transpose)


def check_index_values(indices: torch.Tensor, batch_size: int, spatial_shape: Sequence[int], op: str = OP) -> None:
    """Every row is (b, *coords) with 0 <= b < batch_size and 0 <= coord < spatial_shape."""
    if indices.shape[0] == 0:
        return
    # one intra-op thread: two short scans, where an OpenMP region on a loaded machine costs milliseconds of
    # scheduler waits
    with single_threaded() if indices.device.type == "cpu" else contextlib.nullcontext():
        lo, hi = indices.amin(0).tolist(), indices.amax(0).tolist()
    names = ["batch"] + [f"coordinate {d}" for d in range(len(spatial_shape))]
    limits = (batch_size, *spatial_shape)
    for name, low, high, limit in zip(names, lo, hi, limits):
        require(low >= 0 and high < limit, op,
                f"indices {name} must lie in [0, {limit}), got values in [{low}, {high}]")


DUPLICATE_ROWS = "subm indices must not contain duplicate rows (each active site appears once)"


def check_no_duplicates(sorted_keys: torch.Tensor) -> None:
    """subm maps every site to one row: duplicate rows in ``indices`` make the map ambiguous."""
    if sorted_keys.numel() > 1:
        require(not bool((sorted_keys[1:] == sorted_keys[:-1]).any()), OP, DUPLICATE_ROWS)

