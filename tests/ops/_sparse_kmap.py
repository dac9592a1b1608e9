"""Test-only kernel-map builder that follows the get_indice_pairs contract literally (3-D only).

out o = (p + pad - t*dil) / stride, valid iff exact and 0 <= o < out; k row-major over (kz, ky, kx);
pairs [K, 2, L] filled with -1, valid pairs packed in ascending input row; out_indices sorted by
(b, z, y, x); subm: out_indices = indices. Used as an independent oracle for cvops.get_indice_pairs.
"""
from __future__ import annotations

import itertools

import torch


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
