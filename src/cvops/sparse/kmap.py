"""Kernel-map helpers shared by the functional API, the CPU backend and the layers: output sizes, the subm
identity offset, and each offset's pairs in the order a scatter wants them."""
from __future__ import annotations

from typing import Sequence

import torch

from .._core.dispatch import resolve_backend


def conv_output_size(spatial_shape: Sequence[int], kernel_size, stride, padding, dilation) -> list[int]:
    """``(in + 2p - d(k-1) - 1) // s + 1`` per dimension (mmcv/spconv ``get_conv_output_size``)."""
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1
            for i, k, s, p, d in zip(spatial_shape, kernel_size, stride, padding, dilation)]


def identity_offset(kernel_size: Sequence[int], padding: Sequence[int], dilation: Sequence[int]) -> int:
    """The flattened kernel offset whose subm pairs are ``(i, i)``: ``t = pad / dil`` per dimension.

    A subm map has ``o = p + pad - t*dil``, so the identity sits where ``t*dil == pad``. Returns -1
    when no offset satisfies it (then every offset is gathered and scattered).
    """
    flat = 0
    for k, p, d in zip(kernel_size, padding, dilation):
        if p % d or not 0 <= p // d < k:
            return -1
        flat = flat * k + p // d
    return flat


def sort_pairs_by_output(indice_pairs: torch.Tensor, indice_num: torch.Tensor) -> torch.Tensor:
    """The kernel map with each offset's valid pairs reordered by ascending output row.

    Scattering into rows in ascending order is several times faster on CPU (cache lines are reused)
    than the contract's input-row order; the sums do not change, because within one offset every
    output row occurs at most once. Invalid slots stay -1 at the back.
    """
    return sort_pairs_by_column(indice_pairs, indice_num, 1)


def sort_pairs_by_column(indice_pairs: torch.Tensor, indice_num: torch.Tensor, col: int,
                         backend: str | None = None) -> torch.Tensor:
    """The kernel map with each offset's valid pairs in ascending ``indice_pairs[k, col]`` (stable); the
    map itself when it already is (as every map built on sorted sites is). ``backend``: ``"torch"``,
    ``"numba"`` (a compiled merge sort, contiguous CPU maps) or ``None`` (the device's default)."""
    K, _, L = indice_pairs.shape
    if L < 2:
        return indice_pairs
    if (resolve_backend(__package__, "sort_pairs_by_column", backend, indice_pairs.device) == "numba"
            and indice_pairs.is_contiguous()):
        from . import cpu_numba as fused  # imports numba: only once it is chosen
        # one pass to check, a per-offset merge sort only where needed, no int64 copy of the map
        counts = indice_num.cpu().clamp(0, L)
        if fused.block_bounds(indice_pairs, counts, col, 1 << 62, 0)[1]:
            return indice_pairs
        return fused.sort_pairs_by_column(indice_pairs, counts, col)
    counts = indice_num.to(indice_pairs.device).clamp(0, L)
    keys = indice_pairs[:, col]
    # pair j of offset k is in order when it is past the valid ones or not below pair j - 1
    in_order = (keys[:, 1:] >= keys[:, :-1]) | (torch.arange(1, L, device=keys.device) >= counts[:, None])
    unsorted = torch.nonzero(~in_order.all(1)).squeeze(1).tolist()
    if not unsorted:
        # already in order: true of every map built on sorted input sites (all layers after
        # the first strided conv, since get_indice_pairs' out_indices are sorted)
        return indice_pairs
    # one offset at a time: the scratch is one offset's sort, not int64 copies of the whole map
    result = indice_pairs.clone()
    for k, n in zip(unsorted, counts[unsorted].tolist()):
        order = torch.sort(keys[k, :n], stable=True).indices
        result[k, :, :n] = indice_pairs[k, :, :n].index_select(1, order)
    return result
