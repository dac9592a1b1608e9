"""Triton backend of the sparse convolution: per kernel offset k, in ascending order, gather the rows
(Triton), one GEMM (torch.mm) and scatter-add the rows (Triton).

Deterministic without atomics: within one offset a kernel map holds each row at most once, so each
destination row of a launch has one owner doing a plain load-add-store, and the ascending offsets fix
each sum's order. Half types accumulate in float32. The pair counts are read on the host to size each
launch and GEMM: one synchronisation per call.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._core.indexing import needs_int64

_BLOCK_ROWS = 32


@triton.jit
def _tile(n_rows, n_cols, INDEX_64: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """This program's rows and columns (int64 rows in the large-matrix variant) and their masks."""
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    row_ok = rows < n_rows
    return rows, cols, row_ok[:, None] & (cols < n_cols)[None, :], row_ok


@triton.jit
def _gather_rows_kernel(src_ptr, idx_ptr, dst_ptr, n_rows, n_cols,
                        INDEX_64: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows, cols, mask, row_ok = _tile(n_rows, n_cols, INDEX_64, BLOCK_ROWS, BLOCK_COLS)
    src_rows = tl.load(idx_ptr + rows, mask=row_ok, other=0).to(rows.dtype)
    vals = tl.load(src_ptr + src_rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    tl.store(dst_ptr + rows[:, None] * n_cols + cols[None, :], vals, mask=mask)


@triton.jit
def _scatter_add_rows_kernel(src_ptr, idx_ptr, dst_ptr, n_rows, n_cols,
                             INDEX_64: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    # dst[idx[r]] += src[r]; idx holds distinct rows within a launch, so no two programs touch one row
    rows, cols, mask, row_ok = _tile(n_rows, n_cols, INDEX_64, BLOCK_ROWS, BLOCK_COLS)
    dst_rows = tl.load(idx_ptr + rows, mask=row_ok, other=0).to(rows.dtype)
    dst_offs = dst_rows[:, None] * n_cols + cols[None, :]
    add = tl.load(src_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)
    cur = tl.load(dst_ptr + dst_offs, mask=mask, other=0.0)
    tl.store(dst_ptr + dst_offs, cur + add.to(cur.dtype), mask=mask)


def _grid(n_rows: int, n_cols: int):
    block_cols = min(128, triton.next_power_of_2(max(n_cols, 1)))
    return (triton.cdiv(n_rows, _BLOCK_ROWS), triton.cdiv(n_cols, block_cols)), block_cols


def gather_rows(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``src[idx]`` for a contiguous 2-D ``src`` and 1-D int32/int64 ``idx``."""
    n, c = idx.shape[0], src.shape[1]
    dst = torch.empty(n, c, dtype=src.dtype, device=src.device)
    if n and c:
        grid, block_cols = _grid(n, c)
        _gather_rows_kernel[grid](src, idx.contiguous(), dst, n, c, INDEX_64=needs_int64(src, dst),
                                  BLOCK_ROWS=_BLOCK_ROWS, BLOCK_COLS=block_cols)
    return dst


def scatter_add_rows(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst[idx] += src`` in place, for ``idx`` without repeated rows (a kernel map's per-offset rows)."""
    n, c = idx.shape[0], src.shape[1]
    if n and c:
        grid, block_cols = _grid(n, c)
        src = src.contiguous()
        _scatter_add_rows_kernel[grid](src, idx.contiguous(), dst, n, c, INDEX_64=needs_int64(src, dst),
                                       BLOCK_ROWS=_BLOCK_ROWS, BLOCK_COLS=block_cols)
    return dst


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def forward(features, weight, pairs, indice_num, num_out: int, inverse: bool, identity_offset: int):
    ct = _compute_dtype(features.dtype)
    f, w = features.to(ct).contiguous(), weight.to(ct)
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    counts = [int(c) for c in indice_num.tolist()]
    if identity_offset >= 0:
        out = (f @ w[identity_offset]).contiguous()
    else:
        out = torch.zeros(num_out, weight.shape[2], dtype=ct, device=features.device)
    for k, n in enumerate(counts):
        if n == 0 or k == identity_offset:
            continue
        buf = gather_rows(f, pairs[k, src_col, :n]) @ w[k]
        scatter_add_rows(out, pairs[k, dst_col, :n], buf)
    return out.to(features.dtype)


def backward(grad_out, features, weight, pairs, indice_num, inverse: bool, identity_offset: int):
    ct = _compute_dtype(features.dtype)
    g, f, w = grad_out.to(ct).contiguous(), features.to(ct).contiguous(), weight.to(ct)
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    counts = [int(c) for c in indice_num.tolist()]
    grad_weight = torch.zeros_like(w)
    if identity_offset >= 0:
        grad_features = (g @ w[identity_offset].t()).contiguous()
        grad_weight[identity_offset] = f.t() @ g
    else:
        grad_features = torch.zeros_like(f)
    for k, n in enumerate(counts):
        if n == 0 or k == identity_offset:
            continue
        src, dst = pairs[k, src_col, :n], pairs[k, dst_col, :n]
        g_rows = gather_rows(g, dst)
        scatter_add_rows(grad_features, src, g_rows @ w[k].t())
        grad_weight[k] = gather_rows(f, src).t() @ g_rows
    return grad_features.to(features.dtype), grad_weight.to(weight.dtype)
