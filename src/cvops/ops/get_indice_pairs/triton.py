"""Triton backend of get_indice_pairs (CUDA tensors; tests run it under TRITON_INTERPRET=1).

Kernels do the per-slot work, torch the sorts (a sort-based join, no dense grid): ``_slot_keys_kernel``
writes each (offset, row) slot's int64 output key (-1 off the grid), ``_subm_probe_kernel`` binary-searches
the sorted input keys for it, and ``_pack_pairs_kernel`` scatters the hits to their packed positions
(ascending input row). Geometry is padded to 4-D (``checks.leading_ones``); offsets are int64, as keys
span B * prod(spatial shape).

The output count (``torch.unique``) and subm's duplicate check are read back to the host, so a call
cannot run inside a CUDA graph; the sparse layers cache their maps per ``indice_key``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._core.memory import new_empty
from .checks import Geometry, check_no_duplicates, leading_ones
from .cpu import grid_strides, site_keys, unravel

BLOCK = 256


@triton.jit
def _tap(p, t, s, pad, dil, size, TRANSPOSE: tl.constexpr):
    """Output coordinate of input coordinate ``p`` under kernel tap ``t``, and whether it counts."""
    if TRANSPOSE:
        o = p * s - pad + t * dil
        ok = (o >= 0) & (o < size)
    else:
        num = p + pad - t * dil
        o = num // s                      # only used where num >= 0
        ok = (num >= 0) & (o * s == num) & (o < size)
    return o, ok


@triton.jit
def _slot_key(idx_ptr, rows, row_mask, k, ncols,
              k0, k1, k2, k3, s0, s1, s2, s3, p0, p1, p2, p3, d0, d1, d2, d3,
              n0, n1, n2, n3, volume,
              NDIM: tl.constexpr, TRANSPOSE: tl.constexpr):
    """Linear output index (int64) of the slots (k, rows) and their validity."""
    base = idx_ptr + rows * ncols
    b = tl.load(base, mask=row_mask, other=0).to(tl.int64)
    t3 = k % k3
    r = k // k3
    t2 = r % k2
    r = r // k2
    t1 = r % k1
    t0 = r // k1
    ok = row_mask
    key = b * volume
    # dimension slot j holds spatial dimension j - (4 - NDIM); column j - (4 - NDIM) + 1 of indices
    if NDIM >= 4:
        c = tl.load(base + (1 + 0 - (4 - NDIM)), mask=row_mask, other=0).to(tl.int64)
        o, v = _tap(c, t0, s0, p0, d0, n0, TRANSPOSE)
        key = key + o * n1 * n2 * n3      # o is int64: each product widens first
        ok = ok & v
    if NDIM >= 3:
        c = tl.load(base + (1 + 1 - (4 - NDIM)), mask=row_mask, other=0).to(tl.int64)
        o, v = _tap(c, t1, s1, p1, d1, n1, TRANSPOSE)
        key = key + o * n2 * n3
        ok = ok & v
    if NDIM >= 2:
        c = tl.load(base + (1 + 2 - (4 - NDIM)), mask=row_mask, other=0).to(tl.int64)
        o, v = _tap(c, t2, s2, p2, d2, n2, TRANSPOSE)
        key = key + o * n3
        ok = ok & v
    c = tl.load(base + NDIM, mask=row_mask, other=0).to(tl.int64)
    o, v = _tap(c, t3, s3, p3, d3, n3, TRANSPOSE)
    key = key + o
    ok = ok & v
    return key, ok


@triton.jit
def _slot_keys_kernel(idx_ptr, keys_ptr, L, ncols,
                      k0, k1, k2, k3, s0, s1, s2, s3, p0, p1, p2, p3, d0, d1, d2, d3,
                      n0, n1, n2, n3, volume,
                      NDIM: tl.constexpr, TRANSPOSE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    n_blocks = tl.cdiv(L, BLOCK)
    k = pid // n_blocks
    rows = (pid % n_blocks) * BLOCK + tl.arange(0, BLOCK)
    row_mask = rows < L
    key, ok = _slot_key(idx_ptr, rows, row_mask, k, ncols, k0, k1, k2, k3, s0, s1, s2, s3, p0, p1, p2, p3,
                        d0, d1, d2, d3, n0, n1, n2, n3, volume, NDIM, TRANSPOSE)
    tl.store(keys_ptr + k * L + rows, tl.where(ok, key, -1), mask=row_mask)


@triton.jit
def _subm_probe_kernel(idx_ptr, sorted_ptr, order_ptr, out_ptr, L, ncols,
                       k0, k1, k2, k3, p0, p1, p2, p3, d0, d1, d2, d3,
                       n0, n1, n2, n3, volume,
                       NDIM: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    n_blocks = tl.cdiv(L, BLOCK)
    k = pid // n_blocks
    rows = (pid % n_blocks) * BLOCK + tl.arange(0, BLOCK)
    row_mask = rows < L
    query, ok = _slot_key(idx_ptr, rows, row_mask, k, ncols, k0, k1, k2, k3, 1, 1, 1, 1, p0, p1, p2, p3,
                          d0, d1, d2, d3, n0, n1, n2, n3, volume, NDIM, False)
    # lower bound of query in sorted_keys[0:L]: SEARCH_STEPS = ceil(log2(L + 1)) halvings
    lo = tl.zeros([BLOCK], dtype=tl.int64)
    hi = tl.zeros([BLOCK], dtype=tl.int64) + L
    for _ in range(SEARCH_STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(sorted_ptr + mid, mask=active & ok, other=0)
        right = v < query
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & (~right), mid, hi)
    hit_mask = ok & (lo < L)
    v = tl.load(sorted_ptr + lo, mask=hit_mask, other=-1)
    hit = hit_mask & (v == query)
    j = tl.load(order_ptr + lo, mask=hit, other=-1)
    tl.store(out_ptr + k * L + rows, tl.where(hit, j, -1).to(tl.int32), mask=row_mask)


@triton.jit
def _pack_pairs_kernel(rows_ptr, pos_ptr, pairs_ptr, L, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    n_blocks = tl.cdiv(L, BLOCK)
    k = pid // n_blocks
    i = (pid % n_blocks) * BLOCK + tl.arange(0, BLOCK)
    m = i < L
    row = tl.load(rows_ptr + k * L + i, mask=m, other=-1)
    hit = m & (row >= 0)
    pos = tl.load(pos_ptr + k * L + i, mask=hit, other=1).to(tl.int64) - 1   # inclusive cumsum - 1
    dst = pairs_ptr + k * 2 * L + pos
    tl.store(dst, i.to(tl.int32), mask=hit)
    tl.store(dst + L, row.to(tl.int32), mask=hit)


def _pack(out_rows: torch.Tensor, K: int, L: int):
    valid = out_rows >= 0
    indice_num = valid.sum(1, dtype=torch.int32)
    pos = torch.cumsum(valid, 1, dtype=torch.int32)
    pairs = new_empty((K, 2, L), torch.int32, out_rows.device)
    pairs.fill_(-1)
    grid = (triton.cdiv(L, BLOCK) * K,)
    _pack_pairs_kernel[grid](out_rows, pos, pairs, L, BLOCK=BLOCK)
    return pairs, indice_num


def get_indice_pairs(indices: torch.Tensor, geo: Geometry):
    """``(out_indices, indice_pairs, indice_num)``; ``indices`` is non-empty and already checked."""
    L, K, ndim = indices.shape[0], geo.kernel_volume, geo.ndim
    idx = indices.contiguous()
    ks, pads, dils = leading_ones(geo.kernel_size), leading_ones(geo.padding, 0), leading_ones(geo.dilation)
    sizes = leading_ones(geo.out_spatial_shape)
    _, volume = grid_strides(geo.out_spatial_shape)
    grid = (triton.cdiv(L, BLOCK) * K,)   # one axis: (offset, row block) flattened
    if geo.subm:
        sorted_keys, order = torch.sort(site_keys(idx, geo.spatial_shape))
        check_no_duplicates(sorted_keys)
        out_rows = torch.empty((K, L), dtype=torch.int32, device=idx.device)
        steps = max(1, int(L).bit_length())
        _subm_probe_kernel[grid](idx, sorted_keys, order, out_rows, L, ndim + 1, *ks, *pads, *dils, *sizes, volume,
                                 NDIM=ndim, SEARCH_STEPS=steps, BLOCK=BLOCK)
        pairs, indice_num = _pack(out_rows, K, L)
        return idx.to(torch.int32).clone(), pairs, indice_num
    keys = torch.empty((K, L), dtype=torch.int64, device=idx.device)
    _slot_keys_kernel[grid](idx, keys, L, ndim + 1, *ks, *leading_ones(geo.stride), *pads, *dils, *sizes, volume,
                            NDIM=ndim, TRANSPOSE=geo.transpose, BLOCK=BLOCK)
    valid = keys >= 0
    sites, rows = torch.unique(keys[valid], sorted=True, return_inverse=True)
    out_rows = torch.full((K, L), -1, dtype=torch.int32, device=idx.device)
    out_rows[valid] = rows.to(torch.int32)
    pairs, indice_num = _pack(out_rows, K, L)
    return unravel(sites, geo.out_spatial_shape), pairs, indice_num
