"""The subm kernel map as a numba loop: the ``numba`` backend (see ``_core/dispatch.py``); regular and
transposed maps run ``strided_numba``'s bitmap passes where the bitmap fits their memory rule, else ``cpu.py``.

With row-major linear keys, every kernel offset moves a site by a constant key shift
(``sum_d (pad_d - t_d dil_d) S_d``), so with the sites sorted by key one forward merge per offset finds
its pairs in ``O(L)`` sequential steps. A match counts only when every coordinate lies inside the grid
(a shift can wrap a coordinate into the next row). Pairs are listed in input-row order, as the torch
join lists them: the same map, bit for bit. A centred kernel needs only half the merges: offset
``K - 1 - k`` holds the pairs of ``k`` swapped. Offsets are shared out among cvops's workers.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._core.bits import numpy_alias
from ..._core.jit import njit, use_parallel
from ..._core.parallel import run_parts, single_threaded
from . import cpu, strided_numba


@njit
def _subm_offsets(coords, sorted_keys, order, rank, shape, strides, kernel, pad, dil, mirror, pairs, counts,
                  k_lo, k_hi):
    L = coords.shape[0]
    nd = shape.shape[0]
    K = pairs.shape[0]
    taps = np.empty(nd, dtype=np.int64)
    match = np.empty(L, dtype=np.int64)   # by sorted position: the matched output row, or -1
    for k in range(k_lo, k_hi):
        rest = k
        delta = 0
        for d in range(nd - 1, -1, -1):
            taps[d] = rest % kernel[d]
            rest //= kernel[d]
            delta += (pad[d] - taps[d] * dil[d]) * strides[d]
        q = 0
        for s in range(L):
            target = sorted_keys[s] + delta
            while q < L and sorted_keys[q] < target:
                q += 1
            match[s] = order[q] if q < L and sorted_keys[q] == target else -1
        n = 0
        for i in range(L):
            j = match[rank[i]]
            if j < 0:
                continue
            inside = True
            for d in range(nd):
                o = coords[i, d + 1] + pad[d] - taps[d] * dil[d]
                if o < 0 or o >= shape[d]:
                    inside = False
                    break
            if inside:
                pairs[k, 0, n] = i
                pairs[k, 1, n] = j
                n += 1
        counts[k] = n
        pairs[k, :, n:] = -1
        m = K - 1 - k
        if mirror and m != k:
            # the mirror offset's pairs are (j, i), listed by j: invert k's pairs by row
            partner = match  # reused: indexed by row now
            partner[:] = -1
            for x in range(n):
                partner[pairs[k, 1, x]] = pairs[k, 0, x]
            n = 0
            for j in range(L):
                if partner[j] >= 0:
                    pairs[m, 0, n] = j
                    pairs[m, 1, n] = partner[j]
                    n += 1
            counts[m] = n
            pairs[m, :, n:] = -1


def supports(indices: torch.Tensor) -> bool:
    """The loop reads CPU memory only."""
    return indices.device.type == "cpu"


def subm_pairs(indices: torch.Tensor, sorted_keys: torch.Tensor, order: torch.Tensor, geo, strides):
    """``(indice_pairs [K, 2, L] int32, indice_num [K] int32)`` of a subm map on CPU ``indices`` whose
    linear keys, sorted and free of duplicates, are ``sorted_keys`` (``order``: their rows)."""
    L, K = indices.shape[0], geo.kernel_volume
    coords = indices.to(torch.int64).contiguous()
    order = order.to(torch.int64).contiguous()
    rank = torch.empty_like(order)
    rank[order] = torch.arange(L, dtype=torch.int64)
    pairs = torch.empty((K, 2, L), dtype=torch.int32)
    counts = torch.empty(K, dtype=torch.int32)
    mirror = all(2 * p == d * (k - 1) for p, d, k in zip(geo.padding, geo.dilation, geo.kernel_size))
    merged = (K + 1) // 2 if mirror else K  # offsets found by a merge; the rest are their mirrors

    def vec(values):
        return np.asarray(values, dtype=np.int64)

    args = (numpy_alias(coords), numpy_alias(sorted_keys.contiguous()), numpy_alias(order), numpy_alias(rank),
            vec(geo.spatial_shape), vec(strides), vec(geo.kernel_size), vec(geo.padding), vec(geo.dilation),
            mirror, numpy_alias(pairs), numpy_alias(counts))
    parts = [(k, k + 1) for k in range(merged)] if use_parallel(K * L * 4) else [(0, merged)]
    run_parts(lambda lo, hi: _subm_offsets(*args, lo, hi), parts)
    return pairs, counts


def get_indice_pairs(indices: torch.Tensor, geo):
    """As ``cpu.get_indice_pairs``: a subm map by the merge above, a strided one by ``strided_numba``."""
    if not geo.subm:
        sizes = strided_numba.bitmap_sizes(indices, geo)
        if sizes is not None:
            return strided_numba.strided_pairs(indices, geo, sizes)
        return cpu.get_indice_pairs(indices, geo)
    with single_threaded():  # the sort is one torch op: no OpenMP region on a loaded machine
        sorted_keys, order = cpu._sorted_site_keys(indices, geo)
    pairs, indice_num = subm_pairs(indices, sorted_keys, order, geo, cpu.grid_strides(geo.spatial_shape)[0])
    return indices.to(torch.int32).clone(), pairs, indice_num
