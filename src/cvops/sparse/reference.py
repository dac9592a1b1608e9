"""Loop reference of the sparse convolution on a kernel map (the oracle; never the fast path).

Follows the definition literally, one pair at a time, accumulating in float64:

    out[pairs[k, 1, i]] += features[pairs[k, 0, i]] @ weight[k]      for k < K, i < indice_num[k]

``inverse`` swaps the two pair rows (gather from the output column, scatter to the input column).
``identity_offset`` is accepted for signature parity and ignored: the loop treats every offset alike.
"""
from __future__ import annotations

import torch


def forward(features, weight, pairs, indice_num, num_out: int, inverse: bool, identity_offset: int):
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    f, w = features.double(), weight.double()
    out = torch.zeros(num_out, weight.shape[2], dtype=torch.float64, device=features.device)
    for k in range(weight.shape[0]):
        for i in range(int(indice_num[k])):
            src, dst = int(pairs[k, src_col, i]), int(pairs[k, dst_col, i])
            out[dst] += f[src] @ w[k]
    return out.to(features.dtype)


def backward(grad_out, features, weight, pairs, indice_num, inverse: bool, identity_offset: int):
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    g, f, w = grad_out.double(), features.double(), weight.double()
    grad_features = torch.zeros_like(f)
    grad_weight = torch.zeros_like(w)
    for k in range(weight.shape[0]):
        for i in range(int(indice_num[k])):
            src, dst = int(pairs[k, src_col, i]), int(pairs[k, dst_col, i])
            grad_features[src] += w[k] @ g[dst]
            grad_weight[k] += torch.outer(f[src], g[dst])
    return grad_features.to(features.dtype), grad_weight.to(weight.dtype)
