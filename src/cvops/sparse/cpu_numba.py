"""Row gather and row scatter-add as numba loops: the CPU fast paths of ``cpu.py`` when numba is installed.

Why: ``Tensor.index_add_`` on CPU walks the index serially and pays a tensor-iterator step per row, about
twice the cost of the matching ``index_select``; at network scale it was a fifth of the encoder's time.
Here ``out[index[i]] += rows[i]`` is one tight loop per row. One call moves the rows of a whole round of
``cpu.py`` (a list of chunks, each a run of one offset's pairs), parallel over the rows of a chunk when
torch uses several threads (``cpu.py`` calls them from its single-threaded block workers, so there they
run serially).

Also here: the per-offset block bounds of a sorted map (binary search, plus a branch-free sortedness pass)
and the stable per-offset sort of a map by one column, both without the int64 copy the torch versions make.

Determinism: chunks run in list order and the destination rows of one chunk (one offset) are unique, so
every output element receives its additions in the same order as the torch path (``index_add_`` offset
after offset): the bits are the same whatever the thread count.
"""
from __future__ import annotations

import torch
import numpy as np
from numba import prange

from .._core import jit
from .._core.bits import numpy_alias
from .._core.jit import match_torch_threads, njit_variants
from .._core.validate import require

SUPPORTED = (torch.float32, torch.float64)


def supports(out: torch.Tensor) -> bool:
    return out.device.type == "cpu" and out.dtype in SUPPORTED and out.is_contiguous()


# Every loop checks each row index against the array it indexes and skips (and counts) a row out of
# range, so no index, whatever its origin, reads or writes outside an array; the wrappers raise on a
# non-zero count. The check is one compare per row, beside a loop over the row's channels.

def _raise_if_bad(bad: int, index: torch.Tensor, rows: int) -> None:
    if bad:
        lo, hi = (int(v) for v in torch.aminmax(index))
        require(False, "indice_conv", f"{bad} row index(es) outside [0, {rows}) (indices in [{lo}, {hi}])")


# The chunk-list kernels below serve one round of ``cpu.py``: ``chunks[q] = (k, c0, c1, pos)`` names the
# pairs ``c0:c1`` of offset ``k``, whose rows sit at ``pos:pos + c1 - c0`` of the work buffers. One call
# moves the rows of every chunk of the round, so the Python and dispatch cost is paid per round, not per
# offset. Chunks run in list order (ascending offset) and the rows of one chunk in parallel at most, so
# every output element receives its additions in the same order as the per-offset loop.

def _gather_chunks(out, src, pairs, col, chunks):
    c = src.shape[1]
    limit = src.shape[0]
    bad = 0
    for q in range(chunks.shape[0]):
        k, c0, c1, pos = chunks[q, 0], chunks[q, 1], chunks[q, 2], chunks[q, 3]
        for i in prange(c1 - c0):
            row = pairs[k, col, c0 + i]
            if row < 0 or row >= limit:
                bad += 1
                continue
            for j in range(c):
                out[pos + i, j] = src[row, j]
    return bad


def _scatter_add_chunks(out, pairs, col, chunks, rows):
    c = rows.shape[1]
    limit = out.shape[0]
    bad = 0
    for q in range(chunks.shape[0]):
        k, c0, c1, pos = chunks[q, 0], chunks[q, 1], chunks[q, 2], chunks[q, 3]
        for i in prange(c1 - c0):
            dst = pairs[k, col, c0 + i]
            if dst < 0 or dst >= limit:
                bad += 1
                continue
            for j in range(c):
                out[dst, j] += rows[pos + i, j]
    return bad


def _scatter_add_gather_chunks(out, pairs, col, chunks, rows, taken, src):
    c = rows.shape[1]
    c_src = src.shape[1]
    limit = min(out.shape[0], src.shape[0])
    bad = 0
    for q in range(chunks.shape[0]):
        k, c0, c1, pos = chunks[q, 0], chunks[q, 1], chunks[q, 2], chunks[q, 3]
        for i in prange(c1 - c0):
            row = pairs[k, col, c0 + i]
            if row < 0 or row >= limit:
                bad += 1
                continue
            for j in range(c):
                out[row, j] += rows[pos + i, j]
            for j in range(c_src):
                taken[pos + i, j] = src[row, j]
    return bad


_gather_chunks_variants = njit_variants(_gather_chunks)
_scatter_chunks_variants = njit_variants(_scatter_add_chunks)
_fused_chunks_variants = njit_variants(_scatter_add_gather_chunks)


def _chunk_kernel(variants, work: int):
    if jit.use_parallel(work):
        match_torch_threads()
        return variants[1]
    return variants[0]


def _chunk_rows_used(chunks) -> int:
    return int(chunks[-1, 3] + chunks[-1, 2] - chunks[-1, 1]) if len(chunks) else 0


def gather_chunks(out: torch.Tensor, src: torch.Tensor, pairs: torch.Tensor, col: int, chunks) -> None:
    """``out[pos + i] = src[pairs[k, col, c0 + i]]`` for every chunk ``(k, c0, c1, pos)`` (int64 numpy)."""
    n = _chunk_rows_used(chunks)
    if n == 0:
        return
    require(out.shape[0] >= n and out.shape[1] == src.shape[1], "indice_conv", "gather_chunks: buffer shapes do not match")
    kernel = _chunk_kernel(_gather_chunks_variants, n * out.shape[1])
    bad = kernel(numpy_alias(out), numpy_alias(src), numpy_alias(pairs), col, chunks)
    _raise_if_bad(bad, pairs, src.shape[0])


def scatter_add_chunks(out: torch.Tensor, pairs: torch.Tensor, col: int, chunks, rows: torch.Tensor) -> None:
    """``out[pairs[k, col, c0 + i]] += rows[pos + i]`` for every chunk, in chunk order."""
    n = _chunk_rows_used(chunks)
    if n == 0:
        return
    require(rows.shape[0] >= n and out.shape[1] == rows.shape[1], "indice_conv",
            "scatter_add_chunks: buffer shapes do not match")
    kernel = _chunk_kernel(_scatter_chunks_variants, n * out.shape[1])
    bad = kernel(numpy_alias(out), numpy_alias(pairs), col, chunks, numpy_alias(rows))
    _raise_if_bad(bad, pairs, out.shape[0])


def scatter_add_gather_chunks(out: torch.Tensor, pairs: torch.Tensor, col: int, chunks, rows: torch.Tensor,
                              taken: torch.Tensor, src: torch.Tensor) -> None:
    """:func:`scatter_add_chunks` into ``out`` and ``taken[pos + i] = src[same row]``, one pass."""
    n = _chunk_rows_used(chunks)
    if n == 0:
        return
    require(rows.shape[0] >= n and taken.shape[0] >= n and out.shape[1] == rows.shape[1] and
            taken.shape[1] == src.shape[1], "indice_conv", "scatter_add_gather_chunks: buffer shapes do not match")
    kernel = _chunk_kernel(_fused_chunks_variants, n * (out.shape[1] + src.shape[1]))
    bad = kernel(numpy_alias(out), numpy_alias(pairs), col, chunks, numpy_alias(rows), numpy_alias(taken),
                 numpy_alias(src))
    _raise_if_bad(bad, pairs, min(out.shape[0], src.shape[0]))


def _block_bounds(pairs, counts, col, block_rows, bounds, ascending):
    n_blocks = bounds.shape[1] - 1
    for k in prange(pairs.shape[0]):
        n = counts[k]
        rows = pairs[k, col, :n]
        descents = 0
        for i in range(1, n):  # branch-free, so it vectorises
            descents += rows[i] < rows[i - 1]
        ascending[k] = descents == 0
        for b in range(n_blocks + 1):
            bounds[k, b] = np.searchsorted(rows, b * block_rows) if b < n_blocks else n


_bounds_serial, _bounds_parallel = njit_variants(_block_bounds)


def block_bounds(pairs: torch.Tensor, counts: torch.Tensor, col: int, block_rows: int, n_blocks: int):
    """``(bounds [K, n_blocks + 1], ascending)``: ``bounds[k, b]`` is the first pair of offset ``k`` whose
    ``pairs[k, col]`` row lies in block ``b`` (rows ``[b * block_rows, (b + 1) * block_rows)``), one pass
    over the map; ``ascending`` says whether every offset's column is sorted (else the bounds mean nothing)."""
    K = pairs.shape[0]
    bounds = torch.empty((K, n_blocks + 1), dtype=torch.int64)
    ascending = torch.empty(K, dtype=torch.bool)
    work = int(counts.sum())
    kernel = _bounds_parallel if jit.use_parallel(work) else _bounds_serial
    if kernel is _bounds_parallel:
        match_torch_threads()
    kernel(numpy_alias(pairs), numpy_alias(counts.to(torch.int64)), col, block_rows, numpy_alias(bounds),
           numpy_alias(ascending))
    return bounds, bool(ascending.all())


def _sort_by_column(pairs, counts, col, out):
    for k in prange(pairs.shape[0]):
        n = counts[k]
        order = np.argsort(pairs[k, col, :n], kind="mergesort")
        for c in range(2):
            for i in range(n):
                out[k, c, i] = pairs[k, c, order[i]]
            for i in range(n, pairs.shape[2]):
                out[k, c, i] = pairs[k, c, i]


_sort_serial, _sort_parallel = njit_variants(_sort_by_column)


def sort_pairs_by_column(pairs: torch.Tensor, counts: torch.Tensor, col: int) -> torch.Tensor:
    """Each offset's valid pairs in ascending ``pairs[k, col]`` (stable merge sort), the tail slots as they
    were: the result of ``kmap.sort_pairs_by_column``'s torch sort, without its int64 key copy."""
    out = torch.empty_like(pairs)
    work = int(counts.sum()) * 16
    kernel = _sort_parallel if jit.use_parallel(work) else _sort_serial
    if kernel is _sort_parallel:
        match_torch_threads()
    kernel(numpy_alias(pairs), numpy_alias(counts.to(torch.int64)), col, numpy_alias(out))
    return out
