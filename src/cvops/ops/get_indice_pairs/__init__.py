"""get_indice_pairs: the sparse-convolution kernel map (MLU-OPS ``mluOpGetIndicePairs``, mmcv/spconv).

Contract (decisions.md): ``out_indices [M, NDim + 1]`` int32 sorted ascending by (b, *coords) (subm:
``indices`` itself); ``indice_pairs [K, 2, L]`` int32 filled with -1, ``pairs[k, 0, n]`` the input row
and ``pairs[k, 1, n]`` the output row of the n-th pair of kernel offset k, packed at the front in
ascending input row; ``indice_num [K]`` int32 the pair count per offset.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ..._core.dispatch import backend_module, check_backend
from ..._core.opdef import custom_op
from . import checks
from .checks import OP, Geometry, check_index_values, check_params

__all__ = ["get_indice_pairs", "get_conv_output_size", "get_deconv_output_size"]


def _sizes(input_size, *params):
    """The input sizes as ints and ``(kernel_size, stride, padding, dilation, ...)`` as one int per dimension."""
    n = len(input_size)
    names, lows = ("kernel_size", "stride", "padding", "dilation", "output_padding"), (None, 1, 0, 1, 0)
    return [int(s) for s in input_size], *(checks.pair(OP, name, value, n, min_value=low)
                                           for name, low, value in zip(names, lows, params))


def get_conv_output_size(input_size: Sequence[int], kernel_size, stride, padding, dilation) -> list[int]:
    """Output spatial shape of a sparse conv: ``(in + 2p - d(k-1) - 1) // s + 1`` (k == -1: 1)."""
    return checks.conv_output_size(*_sizes(input_size, kernel_size, stride, padding, dilation))


def get_deconv_output_size(input_size: Sequence[int], kernel_size, stride, padding, dilation,
                           output_padding=0) -> list[int]:
    """Output spatial shape of a transposed sparse conv: ``(in - 1) s - 2p + k + output_padding``."""
    return checks.deconv_output_size(*_sizes(input_size, kernel_size, stride, padding, dilation, output_padding))


def _get_indice_pairs(indices: torch.Tensor, batch_size: int, spatial_shape: list[int], out_spatial_shape: list[int],
                      kernel_size: list[int], stride: list[int], padding: list[int], dilation: list[int], subm: bool,
                      transpose: bool, backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    geo = Geometry(batch_size, tuple(spatial_shape), tuple(out_spatial_shape), tuple(kernel_size),
                   tuple(stride), tuple(padding), tuple(dilation), subm, transpose)
    check_index_values(indices, geo.batch_size, geo.spatial_shape)
    L, K = indices.shape[0], geo.kernel_volume
    if L == 0:  # zero elements: empty outputs of the right shapes
        return (torch.empty((0, geo.ndim + 1), dtype=torch.int32, device=indices.device),
                torch.full((K, 2, 0), -1, dtype=torch.int32, device=indices.device),
                torch.zeros(K, dtype=torch.int32, device=indices.device))
    return backend_module(__package__, OP, backend, indices.device, indices).get_indice_pairs(indices, geo)


def _fake(indices, batch_size, spatial_shape, out_spatial_shape, kernel_size, stride, padding, dilation, subm,
          transpose, backend):
    L, K = indices.shape[0], math.prod(kernel_size)
    num_out = L if subm else torch.library.get_ctx().new_dynamic_size()  # the output count is data-dependent
    return (indices.new_empty((num_out, len(spatial_shape) + 1), dtype=torch.int32),
            indices.new_empty((K, 2, L), dtype=torch.int32),
            indices.new_empty((K,), dtype=torch.int32))


_get_indice_pairs_op = custom_op("get_indice_pairs", _get_indice_pairs, _fake)  # integer maps: no gradient


def get_indice_pairs(indices: torch.Tensor, batch_size: int, spatial_shape: Sequence[int],
                     kernel_size=3, stride=1, padding=0, dilation=1, out_padding=0,
                     subm: bool = False, transpose: bool = False,
                     out_spatial_shape: Optional[Sequence[int]] = None, *,
                     backend: Optional[str] = None, ksize=None):
    """The kernel map of a sparse convolution.

    Args:
        indices: ``[L, NDim + 1]`` int32/int64 active input sites ``(b, *coords)``, NDim in 1..4.
        batch_size: B; every ``b`` lies in ``[0, B)``.
        spatial_shape: input grid ``(D, H, W)`` for 3-D.
        kernel_size, stride, padding, dilation, out_padding: an int or NDim ints (out_padding only
            matters for ``transpose``). ``stride > 1`` and ``dilation > 1`` in one dimension is rejected.
        subm: submanifold conv: output sites are the input sites (stride 1; padding used as given,
            so the identity pairs sit at offset ``t = padding``).
        transpose: deconvolution positions ``o = p*stride - padding + t*dilation``.
        out_spatial_shape: output grid; computed with :func:`get_conv_output_size` (or
            :func:`get_deconv_output_size`) when None.
        backend: ``None`` (the device's default), ``"reference"``, ``"torch"``, ``"numba"`` or
            ``"triton"``; ``"cpu"`` still means the CPU default.
        ksize: mmcv/spconv's name for ``kernel_size`` (keyword only; overrides it when given).

    Returns:
        ``out_indices [M, NDim + 1]`` int32 (sorted by (b, *coords); subm: ``indices``),
        ``indice_pairs [K, 2, L]`` int32 (-1 filled, packed, ascending input row),
        ``indice_num [K]`` int32, with ``K = prod(kernel_size)``.

    Memory on the CPU: the outputs plus the candidate lists of the pairs (a few int64 words per pair
    found, below 1.5x the outputs); no dense table over the spatial shape is ever allocated. The numba
    backend's regular and transposed maps use a bitmap of the output grid (1.5 bits a cell) instead, only
    where it takes no more memory than the sort's 8 bytes per (row, offset) slot.
    """
    if ksize is not None:
        kernel_size = ksize
    geo = check_params(indices, batch_size, spatial_shape, kernel_size, stride, padding, dilation,
                       out_padding, subm, transpose, out_spatial_shape)
    check_backend(__package__, OP, backend, indices.device, indices)
    return _get_indice_pairs_op(indices, geo.batch_size, list(geo.spatial_shape),
                                list(geo.out_spatial_shape), list(geo.kernel_size), list(geo.stride),
                                list(geo.padding), list(geo.dilation), geo.subm, geo.transpose,
                                backend)
