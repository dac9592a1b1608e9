"""The ``torch`` backend of the sparse convolution: plain gather-GEMM-scatter, one offset at a time.

    out = features @ weight[identity]          (the subm identity offset: pairs (i, i) for every row)
    for each offset k with pairs, ascending:
        out.index_add_(0, dst, features[src] @ weight[k])

and the backward reads the same products the other way: ``grad_features`` gathers ``grad_out[dst] @
weight[k].T`` into the source rows the same way, and ``grad_weight[k] = features[src].T @ grad_out[dst]``.

Every output element receives its additions in one order (identity offset first, then ascending k; within
an offset, pairs in map order), and torch's CPU kernels keep it on any thread count: ``index_add_`` adds
the indexed rows one after another and the matrix products split their outputs, not their sums, between
threads (tests/ops/test_sparse_conv_cpu.py checks the bits on 1 and 2 threads). The ``numba`` backend
(``cpu_numba``, the CPU default where numba is installed) makes the same additions in the same order with
SciPy's BLAS for the products, so the two agree to rounding. Half types are computed in float32 and
rounded once at the end. On CUDA, ``index_add_`` adds with atomics (no fixed order).
An offset's pairs are taken in blocks of about 4 MiB (``_core.memory.BLOCK_BYTES``) of gathered rows, so a call holds its
outputs and a few MiB, not a copy of the features (an offset such as a map's identity has a pair for
every row); blocks keep the map order, so the additions and their order are unchanged.
"""
from __future__ import annotations

import torch

from .._core.memory import block_rows, new_empty


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _blocks(indice_num: torch.Tensor, identity_offset: int, row_bytes: int):
    """(k, start, stop) over every offset with pairs, the identity offset excepted, ascending k, in blocks
    of at most ``_core.memory.BLOCK_BYTES`` of rows of ``row_bytes`` each."""
    step = block_rows(row_bytes)
    for k, n in enumerate(indice_num.tolist()):
        if n and k != identity_offset:
            for start in range(0, n, step):
                yield k, start, min(n, start + step)


def forward(features, weight, pairs, indice_num, num_out: int, inverse: bool, identity_offset: int):
    """``[num_out, C_out]``: the sparse convolution of ``features`` over the map."""
    ct = _compute_dtype(features.dtype)
    f, w = features.detach().to(ct).contiguous(), weight.detach().to(ct).contiguous()
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    out = new_empty((num_out, w.shape[2]), ct, f.device)
    if identity_offset >= 0:
        torch.mm(f[:num_out], w[identity_offset], out=out)
    else:
        out.zero_()
    for k, a, b in _blocks(indice_num, identity_offset, max(w.shape[1:]) * w.element_size()):
        rows = torch.index_select(f, 0, pairs[k, src_col, a:b])
        out.index_add_(0, pairs[k, dst_col, a:b], rows @ w[k])
    return out.to(features.dtype)


def backward(grad_out, features, weight, pairs, indice_num, inverse: bool, identity_offset: int):
    """``(grad_features, grad_weight)`` of :func:`forward`."""
    ct = _compute_dtype(features.dtype)
    g, f, w = (t.detach().to(ct).contiguous() for t in (grad_out, features, weight))
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    grad_features = new_empty(tuple(f.shape), ct, f.device)
    grad_weight = torch.zeros_like(w)
    if identity_offset >= 0:
        rows = f.shape[0]
        torch.mm(g[:rows], w[identity_offset].t(), out=grad_features)
        torch.mm(f.t(), g[:rows], out=grad_weight[identity_offset])
    else:
        grad_features.zero_()
    for k, a, b in _blocks(indice_num, identity_offset, max(w.shape[1:]) * w.element_size()):
        src, dst = pairs[k, src_col, a:b], pairs[k, dst_col, a:b]
        g_rows = torch.index_select(g, 0, dst)
        grad_features.index_add_(0, src, g_rows @ w[k].t())
        grad_weight[k].addmm_(torch.index_select(f, 0, src).t(), g_rows)
    return grad_features.to(features.dtype), grad_weight.to(weight.dtype)
