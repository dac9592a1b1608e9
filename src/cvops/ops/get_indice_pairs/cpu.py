"""Vectorised torch backend of get_indice_pairs (device-agnostic torch code).

No dense grid of B * prod(spatial) is ever allocated: every (input row, kernel offset) slot gets an
int64 linear output key (``INVALID_KEY`` and above when the offset misses the output grid), and sites
are joined by sorting -- ``unique`` over the keys for a regular conv, ``searchsorted`` into the sorted
input keys for subm.
"""
from __future__ import annotations

import torch

from ..._core.memory import new_empty
from .checks import INVALID_KEY, Geometry, check_no_duplicates


def _grid_strides(shape) -> list[int]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= size
    return strides[::-1] + [acc]  # per-dimension strides, then the batch stride


def offset_keys(indices: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """``[K, L]`` int64 linear output index of every (offset, input row); >= INVALID_KEY if none.

    Each dimension contributes a small ``[k_d, L]`` table; broadcasting sums them into ``[K, L]`` with
    the kernel offset row-major (last dimension fastest).
    """
    L, ndim = indices.shape[0], geo.ndim
    *strides, batch_stride = _grid_strides(geo.out_spatial_shape)
    idx = indices.to(torch.int64)
    keys = (idx[:, 0] * batch_stride).view(*([1] * ndim), L)
    for d in range(ndim):
        k, s, pad, dil, size = (geo.kernel_size[d], geo.stride[d], geo.padding[d], geo.dilation[d],
                                geo.out_spatial_shape[d])
        taps = torch.arange(k, device=indices.device, dtype=torch.int64).unsqueeze(1) * dil
        p = idx[:, d + 1].unsqueeze(0)
        if geo.transpose:
            o = p * s - pad + taps
            ok = (o >= 0) & (o < size)
        else:
            num = p + pad - taps
            if s == 1:
                o = num
                ok = (num >= 0) & (num < size)
            else:
                o = torch.div(num, s, rounding_mode="floor")
                ok = (num >= 0) & (o * s == num) & (o < size)
        contrib = torch.where(ok, o * strides[d], INVALID_KEY)
        keys = keys + contrib.view(*([1] * d), k, *([1] * (ndim - 1 - d)), L)
    return keys.reshape(geo.kernel_volume, L)


def unravel(keys: torch.Tensor, shape, batch_size: int) -> torch.Tensor:
    """``[M, NDim + 1]`` int32 rows ``(b, *coords)`` of linear indices over ``(batch, *shape)``."""
    out = new_empty((keys.shape[0], len(shape) + 1), torch.int32, keys.device)
    rest = keys
    for d in range(len(shape) - 1, -1, -1):
        out[:, d + 1] = rest % shape[d]
        rest = rest // shape[d]
    out[:, 0] = rest
    return out


def pack_pairs(out_rows: torch.Tensor, L: int):
    """``out_rows [K, L]`` (output row, or -1) -> packed ``indice_pairs [K, 2, L]`` and ``indice_num``.

    ``nonzero`` lists the valid slots sorted by (k, input row), which is exactly the packed order.
    """
    K = out_rows.shape[0]
    pairs = new_empty((K, 2, L), torch.int32, out_rows.device)
    pairs.fill_(-1)
    valid = out_rows >= 0
    indice_num = valid.sum(1, dtype=torch.int32)
    flat = valid.view(-1).nonzero().squeeze(1)           # k * L + i, ascending
    k = torch.div(flat, L, rounding_mode="floor")
    i = flat - k * L
    starts = torch.cumsum(indice_num, 0, dtype=torch.int64) - indice_num
    slot = torch.arange(flat.numel(), device=flat.device) - starts[k]   # position within offset k
    dest = k * (2 * L) + slot
    flat_pairs = pairs.view(-1)
    flat_pairs[dest] = i.to(torch.int32)
    flat_pairs[dest + L] = out_rows.view(-1)[flat].to(torch.int32)
    return pairs, indice_num


def get_indice_pairs(indices: torch.Tensor, geo: Geometry):
    L, K = indices.shape[0], geo.kernel_volume
    keys = offset_keys(indices, geo)
    if geo.subm:
        site_keys = offset_keys_identity(indices, geo)
        sorted_keys, order = torch.sort(site_keys)
        check_no_duplicates(sorted_keys)
        pos = torch.searchsorted(sorted_keys, keys).clamp_(max=max(L - 1, 0))
        found = sorted_keys[pos] == keys
        out_rows = torch.where(found, order[pos], -1)
        out_indices = indices.to(torch.int32).clone()
    else:
        uniq, inverse = torch.unique(keys, sorted=True, return_inverse=True)
        num_out = int(torch.searchsorted(uniq, INVALID_KEY))
        out_rows = torch.where(keys < INVALID_KEY, inverse, -1)
        out_indices = unravel(uniq[:num_out], geo.out_spatial_shape, geo.batch_size)
    pairs, indice_num = pack_pairs(out_rows, L)
    return out_indices, pairs, indice_num


def offset_keys_identity(indices: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """``[L]`` int64 linear index of each input site over ``(batch, *spatial_shape)``."""
    *strides, batch_stride = _grid_strides(geo.spatial_shape)
    idx = indices.to(torch.int64)
    key = idx[:, 0] * batch_stride
    for d in range(geo.ndim):
        key = key + idx[:, d + 1] * strides[d]
    return key
