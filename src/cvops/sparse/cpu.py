"""Vectorised torch backend of the sparse convolution (device-agnostic torch code).

Gather-GEMM-scatter, one GEMM per kernel offset:

    rows_k = features[src_k]            (index_select)
    out[dst_k] += rows_k @ weight[k]    (mm, then index_add_)

Determinism: offsets are visited in ascending k, and within one offset every destination row occurs
at most once (a kernel map pairs each input row with at most one output row per offset and vice
versa), so no row is ever summed in a thread-dependent order. The subm identity offset (the pairs
``(i, i)`` for every row) is one dense matmul that initialises the output.

Half types are computed in float32 and rounded once at the end.
"""
from __future__ import annotations

import torch


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _valid_pairs(pairs: torch.Tensor, counts: list[int], k: int, col: int) -> torch.Tensor:
    return pairs[k, col, :counts[k]]  # int32 or int64: index_select / index_add_ take either


def forward(features, weight, pairs, indice_num, num_out: int, inverse: bool, identity_offset: int):
    ct = _compute_dtype(features.dtype)
    f, w = features.to(ct), weight.to(ct)
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    counts = [int(c) for c in indice_num.tolist()]
    if identity_offset >= 0:
        out = f @ w[identity_offset]
    else:
        out = torch.zeros(num_out, weight.shape[2], dtype=ct, device=features.device)
    for k in range(weight.shape[0]):
        if counts[k] == 0 or k == identity_offset:
            continue
        src = _valid_pairs(pairs, counts, k, src_col)
        dst = _valid_pairs(pairs, counts, k, dst_col)
        out.index_add_(0, dst, f.index_select(0, src) @ w[k])
    return out.to(features.dtype)


def backward(grad_out, features, weight, pairs, indice_num, inverse: bool, identity_offset: int):
    ct = _compute_dtype(features.dtype)
    g, f, w = grad_out.to(ct), features.to(ct), weight.to(ct)
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    counts = [int(c) for c in indice_num.tolist()]
    grad_weight = torch.zeros_like(w)
    if identity_offset >= 0:
        grad_features = g @ w[identity_offset].t()
        grad_weight[identity_offset] = f.t() @ g
    else:
        grad_features = torch.zeros_like(f)
    for k in range(weight.shape[0]):
        if counts[k] == 0 or k == identity_offset:
            continue
        src = _valid_pairs(pairs, counts, k, src_col)
        dst = _valid_pairs(pairs, counts, k, dst_col)
        g_rows = g.index_select(0, dst)
        grad_features.index_add_(0, src, g_rows @ w[k].t())
        torch.mm(f.index_select(0, src).t(), g_rows, out=grad_weight[k])
    return grad_features.to(features.dtype), grad_weight.to(weight.dtype)
