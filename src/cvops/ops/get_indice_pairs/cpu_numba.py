"""The subm kernel map as a numba loop: the CPU fast path of ``cpu.py`` when numba is installed.

On a grid with row-major linear keys ``key(b, o) = b * V + sum_d o_d * S_d``, every kernel offset moves a
site by a constant key shift: ``o = p + pad - t * dil`` gives ``key(o) = key(p) + sum_d (pad_d - t_d dil_d) S_d``.
With the sites sorted by key, the shifted keys of one offset are sorted too, so one forward merge of the
two sorted lists finds every pair of that offset in ``O(L)`` steps, no search and sequential reads. A key
match counts only when every coordinate of ``o`` lies inside the grid (a shift can wrap a coordinate into
the next row). The pairs of each offset are then listed in input-row order, as ``cpu.py``'s torch join
lists them: the result is the same map, bit for bit. One thread: ``cpu.get_indice_pairs`` runs the whole
map on one (a parallel variant never ran there, and numba's parfor pass rejects this loop nest).
"""
from __future__ import annotations

import numpy as np
import torch

from ..._core.bits import numpy_alias
from ..._core.jit import njit


@njit
def _subm_map(coords, sorted_keys, order, rank, shape, strides, kernel, pad, dil, pairs, counts):
    L = coords.shape[0]
    nd = shape.shape[0]
    K = pairs.shape[0]
    for k in range(K):
        taps = np.empty(nd, dtype=np.int64)
        rest = k
        delta = 0
        for d in range(nd - 1, -1, -1):
            taps[d] = rest % kernel[d]
            rest //= kernel[d]
            delta += (pad[d] - taps[d] * dil[d]) * strides[d]
        match = np.empty(L, dtype=np.int64)   # by sorted position: the matched output row, or -1
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
        for x in range(n, L):
            pairs[k, 0, x] = -1
            pairs[k, 1, x] = -1


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

    def vec(values):
        return np.asarray(values, dtype=np.int64)

    _subm_map(numpy_alias(coords), numpy_alias(sorted_keys.contiguous()), numpy_alias(order), numpy_alias(rank),
              vec(geo.spatial_shape), vec(strides), vec(geo.kernel_size), vec(geo.padding), vec(geo.dilation),
              numpy_alias(pairs), numpy_alias(counts))
    return pairs, counts
