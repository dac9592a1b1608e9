"""Test-only kernel-map builder that follows the get_indice_pairs contract literally (3-D only).

out o = (p + pad - t*dil) / stride, valid iff exact and 0 <= o < out; k row-major over (kz, ky, kx);
pairs [K, 2, L] filled with -1, valid pairs packed in ascending input row; out_indices sorted by
(b, z, y, x); subm: out_indices = indices. Used as an independent oracle for cvops.get_indice_pairs.
Also the sparse tensors and kernel-map cases the sparse-conv test files share.
"""
from __future__ import annotations

import itertools
import math

import torch

from cvops import sparse


def build_kernel_map(indices, batch_size, spatial_shape, kernel_size, stride, padding, dilation, out_padding=0,
                     subm=False, transpose=False, out_spatial_shape=None):
    assert not transpose
    nd = len(spatial_shape)
    if subm:
        out_shape = list(spatial_shape)
    else:
        out_shape = [(i + 2 * p - d * (k - 1) - 1) // s + 1
                     for i, k, s, p, d in zip(spatial_shape, kernel_size, stride, padding, dilation)]
    L = indices.shape[0]
    idx = indices.long().tolist()
    offsets = list(itertools.product(*[range(k) for k in kernel_size]))
    K = len(offsets)

    def lin(b, o):
        v = b
        for c, s in zip(o, out_shape):
            v = v * s + c
        return v

    hits = []  # (k, input row, output linear index)
    for k, t in enumerate(offsets):
        for i, row in enumerate(idx):
            o = []
            for p, tt, pad, dil, s, size in zip(row[1:], t, padding, dilation, stride, out_shape):
                num = p + pad - tt * dil
                if num < 0 or num % s or num // s >= size:
                    break
                o.append(num // s)
            if len(o) == nd:
                hits.append((k, i, lin(row[0], o)))
    if subm:
        table = {lin(r[0], r[1:]): j for j, r in enumerate(idx)}
        out_indices = indices.clone()
    else:
        uniq = sorted({h[2] for h in hits})
        table = {v: j for j, v in enumerate(uniq)}
        rows = []
        for v in uniq:
            coord = []
            for s in reversed(out_shape):
                coord.append(v % s)
                v //= s
            rows.append([v] + coord[::-1])
        out_indices = torch.tensor(rows, dtype=torch.int32).reshape(-1, nd + 1)
    pairs = torch.full((K, 2, L), -1, dtype=torch.int32)
    num = torch.zeros(K, dtype=torch.int32)
    for k, i, v in hits:  # hits are in (k, ascending input row) order
        if v in table:
            n = int(num[k])
            pairs[k, 0, n], pairs[k, 1, n] = i, table[v]
            num[k] += 1
    return out_indices.to(indices.device), pairs.to(indices.device), num.to(indices.device)


def random_sparse(batch, shape, n, channels, *, dtype=torch.float64, seed=0, sort=False):
    """``n`` distinct random sites of a ``batch x shape`` grid with random features (fixed seed)."""
    g = torch.Generator().manual_seed(seed)
    total = batch * math.prod(shape)
    lin = torch.randperm(total, generator=g)[:n]
    if sort:
        lin = lin.sort().values
    coords = []
    for s in reversed(shape):
        coords.append(lin % s)
        lin = lin // s
    indices = torch.stack([lin] + coords[::-1], dim=1).to(torch.int32)
    features = torch.randn(n, channels, generator=g, dtype=torch.float64).to(dtype)
    return sparse.SparseConvTensor(features, indices, list(shape), batch)


def map_case(subm=False, inverse=False, seed=5, n=30, cin=3, cout=4):
    """``(features, weight, pairs, num, num_out, inverse, identity_offset)`` for ``sparse.indice_conv``: a 3x3x3
    conv (stride (2, 1, 2)), subm or inverse map over 2 x (4, 5, 6) sites."""
    x = random_sparse(2, (4, 5, 6), n, cin, dtype=torch.float32, seed=seed)
    pad = 1 if subm else 0
    out_idx, pairs, num = build_kernel_map(x.indices, 2, x.spatial_shape, [3, 3, 3], [1, 1, 1] if subm else [2, 1, 2],
                                           [pad] * 3, [1, 1, 1], subm=subm)
    g = torch.Generator().manual_seed(seed + 1)
    weight = torch.randn(27, cin, cout, generator=g)
    ident = sparse.identity_offset((3, 3, 3), (pad,) * 3, (1, 1, 1)) if subm else -1
    if inverse:
        feats = torch.randn(out_idx.shape[0], cout, generator=g)
        weight = torch.randn(27, cout, cin, generator=g)
        return feats, weight, pairs, num, x.features.shape[0], True, -1
    return x.features, weight, pairs, num, out_idx.shape[0], False, ident


MAP_CASES = {"conv": {}, "subm": {"subm": True}, "inverse": {"inverse": True}}
