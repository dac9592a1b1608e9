"""The ``torch`` backend of get_indice_pairs (device-agnostic torch code).

Sites are joined on int64 linear indices by sorting, never through a dense grid of B * prod(spatial):

* regular / transposed conv: the (offset, input row) slots on the output grid, listed in (offset, row)
  order (the packed order of ``indice_pairs``); ``unique`` over their output keys gives the sorted
  ``out_indices`` and each pair's output row;
* subm: per offset of the leading dimensions (z, y for 3-D), one ``searchsorted`` of the sorted site
  keys finds where the window of the last dimension starts; the at most ``(kx - 1) * dil + 1`` keys
  from there are the only candidates, so a site costs ``kz * ky`` binary searches instead of ``K``.
"""
from __future__ import annotations

import math

import torch

from ..._core.memory import new_empty
from ..._core.parallel import single_threaded
from .checks import INVALID_KEY, Geometry, check_no_duplicates


def grid_strides(shape) -> tuple[list[int], int]:
    """Row-major strides of ``shape`` and its volume (the batch stride of a linear index)."""
    return [math.prod(shape[d + 1:]) for d in range(len(shape))], math.prod(shape)


def tap_positions(coord: torch.Tensor, d: int, geo: Geometry):
    """Output coordinate ``[k_d, L]`` of every kernel tap of dimension ``d``, and whether it counts."""
    k, s, pad, dil, size = (geo.kernel_size[d], geo.stride[d], geo.padding[d], geo.dilation[d],
                            geo.out_spatial_shape[d])
    taps = torch.arange(k, device=coord.device, dtype=torch.int64).unsqueeze(1) * dil
    p = coord.unsqueeze(0)
    if geo.transpose:
        o = p * s - pad + taps
        return o, (o >= 0) & (o < size)
    num = p + pad - taps
    if s == 1:
        return num, (num >= 0) & (num < size)
    o = torch.div(num, s, rounding_mode="floor")
    return o, (num >= 0) & (o * s == num) & (o < size)


def unravel(keys: torch.Tensor, shape) -> torch.Tensor:
    """``[M, NDim + 1]`` int32 rows ``(b, *coords)`` of linear indices over ``(batch, *shape)``."""
    out = new_empty((keys.shape[0], len(shape) + 1), torch.int32, keys.device)
    rest = keys
    for d in range(len(shape) - 1, -1, -1):
        out[:, d + 1] = rest % shape[d]
        rest = rest // shape[d]
    out[:, 0] = rest
    return out


def pack_pairs(k: torch.Tensor, i: torch.Tensor, j: torch.Tensor, K: int, L: int):
    """Pairs listed in (offset k, input row i) order -> ``indice_pairs [K, 2, L]`` and ``indice_num``."""
    pairs = new_empty((K, 2, L), torch.int32, i.device)
    pairs.fill_(-1)
    indice_num = torch.bincount(k, minlength=K)
    starts = torch.cumsum(indice_num, 0) - indice_num
    dest = k * (2 * L) + (torch.arange(k.numel(), device=k.device) - starts[k])
    flat = pairs.view(-1)
    flat[dest] = i.to(torch.int32)
    flat[dest + L] = j.to(torch.int32)
    return pairs, indice_num.to(torch.int32)


def _conv_pairs(indices: torch.Tensor, geo: Geometry):
    L, ndim, K = indices.shape[0], geo.ndim, geo.kernel_volume
    idx = indices.to(torch.int64)
    strides, volume = grid_strides(geo.out_spatial_shape)
    partial_keys, valid = [], None
    for d in range(ndim):
        o, ok = tap_positions(idx[:, d + 1], d, geo)
        part = o * strides[d]
        if d == 0:
            part += idx[:, 0] * volume                    # the batch term rides on dimension 0
        partial_keys.append(part.view(-1))
        shape = [1] * ndim + [L]
        shape[d] = geo.kernel_size[d]
        ok = ok.view(shape)
        valid = ok if valid is None else valid & ok
    flat = valid.reshape(-1).nonzero().squeeze(1)      # k * L + i, ascending: the packed order
    del valid                                          # scratch goes as soon as it is used (peak memory)
    k = torch.div(flat, L, rounding_mode="floor")
    i = flat - k * L
    del flat
    # tap of dimension d for offset k, as a row offset into the [k_d, L] tables (tiny lookup, no division)
    taps = torch.cartesian_prod(*[torch.arange(kd, dtype=torch.int64, device=idx.device) for kd in geo.kernel_size])
    taps = taps.view(K, ndim) * L
    key = None
    for d in range(ndim):
        part = partial_keys[d].index_select(0, taps[:, d].index_select(0, k) + i)
        key = part if key is None else key.add_(part)
    del partial_keys, part, taps
    sites, rows = torch.unique(key, sorted=True, return_inverse=True)
    del key
    out_indices = unravel(sites, geo.out_spatial_shape)
    del sites
    pairs, indice_num = pack_pairs(k, i, rows, K, L)
    return out_indices, pairs, indice_num


def site_keys(indices: torch.Tensor, shape) -> torch.Tensor:
    """``[L]`` int64 linear index of each row ``(b, *coords)`` over ``(batch, *shape)``."""
    strides, volume = grid_strides(shape)
    idx = indices.to(torch.int64)
    key = idx[:, 0] * volume
    for d in range(len(shape)):
        key = key + idx[:, d + 1] * strides[d]
    return key


def _sorted_site_keys(indices: torch.Tensor, geo: Geometry):
    sorted_keys, order = torch.sort(site_keys(indices, geo.spatial_shape))
    check_no_duplicates(sorted_keys)
    return sorted_keys, order


def _subm_pairs(indices: torch.Tensor, geo: Geometry):
    L = indices.shape[0]
    sorted_keys, order = _sorted_site_keys(indices, geo)
    # the search's per-site tables die with its frame, before the [K, 2, L] map is allocated (peak memory)
    s, k, p = _subm_matches(indices, sorted_keys, order, geo)
    i, j = order.index_select(0, s), order.index_select(0, p)
    del s, p
    slot_order = torch.sort(k * L + i).indices                   # (offset, input row) order
    k, i, j = k.index_select(0, slot_order), i.index_select(0, slot_order), j.index_select(0, slot_order)
    pairs, indice_num = pack_pairs(k, i, j, geo.kernel_volume, L)
    return indices.to(torch.int32).clone(), pairs, indice_num


def _subm_matches(indices: torch.Tensor, sorted_keys: torch.Tensor, order: torch.Tensor, geo: Geometry):
    """Every (site s, offset k, neighbour p) of the subm map, s and p as positions in key order."""
    ndim = geo.ndim
    strides, volume = grid_strides(geo.spatial_shape)
    coords = indices.to(torch.int64).index_select(0, order)     # sites in sorted order
    last = ndim - 1
    kx, pad_x, dil_x, width = geo.kernel_size[last], geo.padding[last], geo.dilation[last], geo.spatial_shape[last]
    window = (kx - 1) * dil_x + 1
    px = coords[:, last + 1]
    x_hi = (px + pad_x).clamp(max=width - 1)                  # tap 0 is the largest x
    x_lo = (px + pad_x - (kx - 1) * dil_x).clamp(min=0)
    lead = [tap_positions(coords[:, d + 1], d, geo) for d in range(last)]
    base_b = coords[:, 0] * volume
    lead_kernel = geo.kernel_size[:last]
    n_groups = math.prod(lead_kernel)
    # a sentinel tail above every real key lets the window run past the end without clamping
    padded_keys = torch.cat([sorted_keys, sorted_keys.new_full((window,), INVALID_KEY)])
    empty = torch.empty(0, dtype=torch.int64, device=indices.device)
    found_s, found_k, found_p = [empty], [empty], [empty]
    # centred kernel (2 * pad == dil * (k - 1) everywhere): offset K-1-k holds the pairs of k swapped, so
    # the groups past the middle come from their mirror for free
    centred = all(2 * p == d * (k - 1) for p, d, k in zip(geo.padding, geo.dilation, geo.kernel_size))
    K = geo.kernel_volume
    for g in range((n_groups + 1) // 2 if centred else n_groups):
        row_base, ok, rest = base_b, x_lo <= x_hi, g
        for d in range(last - 1, -1, -1):
            t = rest % lead_kernel[d]
            rest //= lead_kernel[d]
            o, valid = lead[d]
            row_base = row_base + o[t] * strides[d]
            ok = ok & valid[t]
        lo = torch.where(ok, row_base + x_lo, INVALID_KEY)
        hi = torch.where(ok, row_base + x_hi, -1)
        pos0 = torch.searchsorted(sorted_keys, lo)
        x_anchor = row_base + px + pad_x            # key of the x reached by tap 0
        for m in range(window):
            cand = padded_keys[pos0 + m]
            s = (cand <= hi).nonzero().squeeze(1)
            if s.numel() == 0:
                break
            # x of the candidate -> tap index: px + pad_x - x = tap * dil_x
            diff = x_anchor.index_select(0, s) - cand.index_select(0, s)
            pos = pos0.index_select(0, s) + m
            if dil_x > 1:
                on_tap = diff % dil_x == 0
                s, diff, pos = s[on_tap], diff[on_tap], pos[on_tap]
            k = g * kx + torch.div(diff, dil_x, rounding_mode="floor")
            found_s.append(s)
            found_k.append(k)
            found_p.append(pos)
            if centred and g != n_groups - 1 - g:
                found_s.append(pos)
                found_k.append(K - 1 - k)
                found_p.append(s)
    return torch.cat(found_s), torch.cat(found_k), torch.cat(found_p)


def get_indice_pairs(indices: torch.Tensor, geo: Geometry):
    """``(out_indices, indice_pairs, indice_num)``; ``indices`` is non-empty and already checked.

    On CPU it runs on one intra-op thread: a chain of short ops, where OpenMP fork/join costs more than
    it saves (a scheduler wait per parallel region on a loaded machine).
    """
    if indices.device.type != "cpu":
        return (_subm_pairs if geo.subm else _conv_pairs)(indices, geo)
    with single_threaded():
        return (_subm_pairs if geo.subm else _conv_pairs)(indices, geo)
