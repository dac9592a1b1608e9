"""Plain-loop oracle of get_indice_pairs (semantics.md §5, the doc's 1.2 algorithm).

For every active input row i and every kernel offset k (row-major over the kernel dimensions, the last
one fastest) the output position is ``o = (p + pad - t*dil) / stride`` (exact division only) or, for a
transposed conv, ``o = p*stride - pad + t*dil``; it counts when ``0 <= o < out``. Never the fast path.
"""
from __future__ import annotations

import itertools

import torch

from ..._core.validate import require
from .checks import DUPLICATE_ROWS, OP, Geometry


def _output_position(point, offset, geo: Geometry):
    out = []
    for p, t, s, pad, dil, size in zip(point, offset, geo.stride, geo.padding, geo.dilation,
                                       geo.out_spatial_shape):
        if geo.transpose:
            o = p * s - pad + t * dil
        else:
            num = p + pad - t * dil
            if num < 0 or num % s != 0:
                return None
            o = num // s
        if not 0 <= o < size:
            return None
        out.append(o)
    return tuple(out)


def get_indice_pairs(indices: torch.Tensor, geo: Geometry):
    rows = [tuple(r) for r in indices.tolist()]
    offsets = list(itertools.product(*[range(k) for k in geo.kernel_size]))
    K, L = len(offsets), len(rows)
    pairs_of_offset: list[list[tuple[int, object]]] = [[] for _ in range(K)]
    for i, row in enumerate(rows):
        for k, offset in enumerate(offsets):
            o = _output_position(row[1:], offset, geo)
            if o is not None:
                pairs_of_offset[k].append((i, (row[0],) + o))

    if geo.subm:
        row_of_site = {row: j for j, row in enumerate(rows)}
        require(len(row_of_site) == L, OP, DUPLICATE_ROWS)
        out_indices = indices.to(torch.int32).clone()
        pairs_of_offset = [[(i, row_of_site[site]) for i, site in lst if site in row_of_site]
                           for lst in pairs_of_offset]
    else:
        sites = sorted({site for lst in pairs_of_offset for _, site in lst})
        row_of_site = {site: r for r, site in enumerate(sites)}
        out_indices = torch.tensor(sites, dtype=torch.int32).reshape(len(sites), geo.ndim + 1)
        pairs_of_offset = [[(i, row_of_site[site]) for i, site in lst] for lst in pairs_of_offset]

    indice_pairs = torch.full((K, 2, L), -1, dtype=torch.int32)
    indice_num = torch.zeros(K, dtype=torch.int32)
    for k, lst in enumerate(pairs_of_offset):
        indice_num[k] = len(lst)
        for n, (i, j) in enumerate(lst):
            indice_pairs[k, 0, n] = i
            indice_pairs[k, 1, n] = j
    return out_indices, indice_pairs, indice_num
