"""Vectorised torch backend of the sparse convolution (device-agnostic torch code).

Gather-GEMM-scatter, one GEMM per kernel offset:

    rows_k = features[src_k]            (index_select)
    out[dst_k] += rows_k @ weight[k]    (mm, then a row scatter-add: index_add_, or cpu_numba's loop)

Determinism: offsets are visited in ascending k, and within one offset every destination row occurs
at most once (a kernel map pairs each input row with at most one output row per offset and vice
versa), so no row is ever summed in a thread-dependent order. The subm identity offset (the pairs
``(i, i)`` for every row) is one dense matmul that initialises the output.

The gathered rows and GEMM products of every offset go into two workspaces allocated once per call
(huge-page backed, ``_core.memory``): a fresh 100 MB buffer per offset would page-fault on every
touch, which at network scale costs as much as the GEMMs. Half types are computed in float32 and
rounded once at the end.
"""
from __future__ import annotations

import torch

from .._core.jit import numba_enabled
from .._core.memory import new_empty, new_zeros


def _scatter(out: torch.Tensor):
    """``scatter(index, rows)``: ``out[index] += rows`` for one offset (unique rows), numba when enabled."""
    if numba_enabled():
        from . import cpu_numba
        if cpu_numba.supports(out):
            return lambda index, rows: cpu_numba.scatter_add_rows(out, index, rows)
    return lambda index, rows: out.index_add_(0, index, rows)


def _gather(src: torch.Tensor):
    """``gather(index, out)``: ``out[:] = src[index]``, numba when enabled."""
    if numba_enabled():
        from . import cpu_numba
        if cpu_numba.supports(src):
            return lambda index, out: cpu_numba.gather_rows(out, src, index)
    return lambda index, out: torch.index_select(src, 0, index, out=out)


def _scatter_gather(out: torch.Tensor, src: torch.Tensor):
    """``scatter_gather(index, rows, taken)``: ``out[index] += rows`` and ``taken[:] = src[index]``, one
    numba pass over ``index`` when enabled (both touch the same rows)."""
    if numba_enabled():
        from . import cpu_numba
        if cpu_numba.supports(out) and cpu_numba.supports(src):
            return lambda index, rows, taken: cpu_numba.scatter_add_gather_rows(out, index, rows, taken, src)

    def separate(index, rows, taken):
        out.index_add_(0, index, rows)
        torch.index_select(src, 0, index, out=taken)
    return separate


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _offsets(counts: list[int], identity_offset: int):
    """(k, n) for every offset with pairs, the identity offset excepted."""
    return [(k, n) for k, n in enumerate(counts) if n and k != identity_offset]


def forward(features, weight, pairs, indice_num, num_out: int, inverse: bool, identity_offset: int):
    ct = _compute_dtype(features.dtype)
    f, w = features.to(ct), weight.to(ct)
    c_in, c_out = w.shape[1], w.shape[2]
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    todo = _offsets([int(c) for c in indice_num.tolist()], identity_offset)
    if identity_offset >= 0:
        out = torch.mm(f, w[identity_offset], out=new_empty((num_out, c_out), ct, f.device))
    else:
        out = new_zeros((num_out, c_out), ct, f.device)
    width = max((n for _, n in todo), default=0)
    rows = new_empty((width, c_in), ct, f.device)
    prods = new_empty((width, c_out), ct, f.device)
    scatter, gather = _scatter(out), _gather(f)
    for k, n in todo:
        gather(pairs[k, src_col, :n], rows[:n])
        torch.mm(rows[:n], w[k], out=prods[:n])
        scatter(pairs[k, dst_col, :n], prods[:n])
    return out.to(features.dtype)


def backward(grad_out, features, weight, pairs, indice_num, inverse: bool, identity_offset: int):
    ct = _compute_dtype(features.dtype)
    g, f, w = grad_out.to(ct), features.to(ct), weight.to(ct)
    c_in, c_out = w.shape[1], w.shape[2]
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    todo = _offsets([int(c) for c in indice_num.tolist()], identity_offset)
    grad_weight = torch.zeros_like(w)
    if identity_offset >= 0:
        grad_features = torch.mm(g, w[identity_offset].t(), out=new_empty(tuple(f.shape), ct, f.device))
        torch.mm(f.t(), g, out=grad_weight[identity_offset])
    else:
        grad_features = new_zeros(tuple(f.shape), ct, f.device)
    width = max((n for _, n in todo), default=0)
    g_rows = new_empty((width, c_out), ct, f.device)
    f_rows = new_empty((width, c_in), ct, f.device)
    prods = new_empty((width, c_in), ct, f.device)
    gather_g, scatter_gather_f = _gather(g), _scatter_gather(grad_features, f)
    for k, n in todo:
        src, dst = pairs[k, src_col, :n], pairs[k, dst_col, :n]
        gather_g(dst, g_rows[:n])
        torch.mm(g_rows[:n], w[k].t(), out=prods[:n])
        scatter_gather_f(src, prods[:n], f_rows[:n])
        torch.mm(f_rows[:n].t(), g_rows[:n], out=grad_weight[k])
    return grad_features.to(features.dtype), grad_weight.to(weight.dtype)
