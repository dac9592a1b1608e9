"""The sparse convolution's ``numba`` backend (see ``_core/dispatch.py``): one compiled call per direction.

Why: the torch path (``cpu.py``) streams each offset's gathered rows and products through memory, one
offset after another, three torch ops per offset. Here a whole layer's forward (and its backward) is one
compiled call that releases the GIL: blocks of destination rows in parallel (ranges of blocks claimed by the
calling thread and cvops's workers, ``_core.parallel.run_parts``), and inside a block, offset after offset,
a gather of the offset's rows into a work buffer, one matrix product (``np.dot``, which numba hands to
SciPy's BLAS, held to one thread per call by threadpoolctl so the blocks are the parallelism) and a
scatter-add into the block's own output rows. The block keeps its output rows and work buffers in cache
between the three steps. Each offset's pairs are sorted by the block's row column (the layers pass maps in
that order; others are sorted here), so a block's pairs of one offset are one contiguous segment.

Determinism: a block's work depends only on its rows (fixed block sizes, independent of the thread count),
every output row belongs to one block, and inside a block the offsets run in ascending order (the identity
offset first), so the bits are the same on any thread count. The weight gradient is a partial per block
(``np.dot`` of each chunk's gathered input rows, transposed, with its gradient rows), added in block order; the
blocks run in waves whose partials fill at most ``PARTIAL_BYTES``. The matrix products are SciPy's BLAS, not
torch's, so the results agree with the torch path to rounding (within 1e-6 relative), not bit for bit.

Every loop checks each row index against the array it indexes (and that a destination row lies in its
block); a bad index is counted and skipped, never read or written, and the wrapper raises.

Also here: the per-offset block bounds of a sorted map (binary search, plus a branch-free sortedness pass)
and the stable per-offset sort of a map by one column (without the int64 key copy of ``kmap``'s torch sort),
one offset a part on cvops's workers.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot calls it; loaded before threadpoolctl looks)
import torch
from threadpoolctl import ThreadpoolController

from .._core import jit
from .._core.bits import numpy_alias
from .._core.jit import inline, njit
from .._core.memory import new_empty
from .._core.parallel import guided_parts, run_parts
from .._core.validate import require
from . import cpu

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # halves computed in float32
_BLAS = ThreadpoolController()
BLOCK_BYTES = 1 << 20   # rows per block: this many bytes of the block's own (output or gradient) rows ...
BLOCK_ROWS = (1024, 16384)  # ... within these bounds
CHUNK_BYTES = 1 << 20   # the most pairs gathered per product: this many bytes of the wider row side
PARTIAL_BYTES = 16 << 20  # the backward's weight-gradient partials held at once (a wave of blocks)


def supports(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype in SUPPORTED for t in tensors)


def _block_rows(channels: int, itemsize: int) -> int:
    lo, hi = BLOCK_ROWS
    return max(lo, min(hi, BLOCK_BYTES // max(1, channels * itemsize)))


def _chunk_rows(channels: int, itemsize: int) -> int:
    return max(1, CHUNK_BYTES // max(1, channels * itemsize))


def forward(features, weight, pairs, indice_num, num_out: int, inverse: bool, identity_offset: int):
    """As ``cpu.forward``: ``[num_out, C_out]``, one call of the compiled layer."""
    ct = cpu._compute_dtype(features.dtype)
    f, w = features.detach().to(ct).contiguous(), weight.detach().to(ct).contiguous()
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    out = new_empty((num_out, w.shape[2]), ct, f.device)
    block = _block_rows(w.shape[2], out.element_size())
    pairs, bounds, todo = _blocked_map(pairs, indice_num, dst_col, block, num_out, identity_offset)
    conv_forward(out, f, w, pairs, bounds, todo, identity_offset, src_col, dst_col, block,
                 _chunk_rows(max(w.shape[1], w.shape[2]), out.element_size()))
    return out.to(features.dtype)


def backward(grad_out, features, weight, pairs, indice_num, inverse: bool, identity_offset: int):
    """As ``cpu.backward``: ``(grad_features, grad_weight)``, one call of the compiled layer."""
    ct = cpu._compute_dtype(features.dtype)
    g, f, w = (t.detach().to(ct).contiguous() for t in (grad_out, features, weight))
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    grad_features = new_empty(tuple(f.shape), ct, f.device)
    grad_weight = torch.zeros_like(w)
    block = _block_rows(w.shape[1], grad_features.element_size())
    # the input gradient scatters into the source rows: blocks of source rows
    pairs, bounds, todo = _blocked_map(pairs, indice_num, src_col, block, f.shape[0], identity_offset)
    conv_backward(grad_features, grad_weight, g, f, w, pairs, bounds, todo, identity_offset, src_col, dst_col,
                  block, _chunk_rows(max(w.shape[1], w.shape[2]), grad_features.element_size()))
    return grad_features.to(features.dtype), grad_weight.to(weight.dtype)


def _blocked_map(pairs, indice_num, col: int, block: int, rows: int, identity_offset: int):
    """``(pairs, bounds, todo)`` for the kernels: the map with each offset ascending in ``pairs[k, col]``
    (sorted here if it is not), the first pair of each offset in each block of ``block`` rows, and the
    offsets with pairs, the identity offset excepted."""
    counts = indice_num.to(torch.int64)
    pairs = pairs.contiguous()
    n_blocks = -(-rows // block)
    bounds, ascending = block_bounds(pairs, counts, col, block, n_blocks)
    if not ascending:
        pairs = sort_pairs_by_column(pairs, counts, col)
        bounds, _ = block_bounds(pairs, counts, col, block, n_blocks)
    todo = np.array([k for k, n in enumerate(counts.tolist()) if n and k != identity_offset], np.int64)
    return pairs, bounds, todo


def _raise_if_bad(bad: int, index: torch.Tensor, rows: int) -> None:
    if bad:
        lo, hi = (int(v) for v in torch.aminmax(index))
        require(False, "indice_conv", f"{bad} row index(es) outside [0, {rows}) or outside their block "
                                      f"(indices in [{lo}, {hi}])")


@inline
def _gather_rows(rows, src, pairs, k, col, start, n, lo, hi):
    """``rows[i] = src[pairs[k, col, start + i]]`` for ``i < n``; a row index outside ``[lo, hi)`` is counted
    and gives a row of zeros. Returns the count."""
    bad = 0
    for i in range(n):
        r = pairs[k, col, start + i]
        if r < lo or r >= hi:
            bad += 1
            r = -1
        for j in range(rows.shape[1]):  # element loops: numba's slice assignment costs twice the time here
            rows[i, j] = src[r, j] if r >= 0 else 0
    return bad


@inline
def _scatter_add_rows(out, rows, pairs, k, col, start, n, lo, hi):
    """``out[pairs[k, col, start + i]] += rows[i]`` for ``i < n``, rows in order; a row index outside
    ``[lo, hi)`` (the block's own rows) is counted and skipped. Returns the count."""
    bad = 0
    for i in range(n):
        r = pairs[k, col, start + i]
        if r < lo or r >= hi:
            bad += 1
            continue
        for j in range(rows.shape[1]):
            out[r, j] += rows[i, j]
    return bad


@njit
def _conv_forward(out, f, w, pairs, bounds, todo, identity, src_col, dst_col, block, chunk, b_lo, b_hi):
    bad = 0
    for b in range(b_lo, b_hi):
        r0 = b * block
        r1 = min(out.shape[0], r0 + block)
        rows = np.empty((chunk, f.shape[1]), f.dtype)
        prods = np.empty((chunk, w.shape[2]), f.dtype)
        if identity >= 0:
            np.dot(f[r0:r1], w[identity], out[r0:r1])
        else:
            out[r0:r1] = 0
        for t in range(todo.shape[0]):
            k = todo[t]
            start, end = bounds[k, b], bounds[k, b + 1]
            while start < end:
                n = min(end - start, chunk)
                bad += _gather_rows(rows, f, pairs, k, src_col, start, n, 0, f.shape[0])
                np.dot(rows[:n], w[k], prods[:n])
                bad += _scatter_add_rows(out, prods, pairs, k, dst_col, start, n, r0, r1)
                start += n
    return bad


@njit
def _conv_backward(grad_f, partials, first, g, f, w_t, pairs, bounds, todo, identity, src_col, dst_col, block,
                   chunk, b_lo, b_hi):
    bad = 0
    for b in range(b_lo, b_hi):
        r0 = b * block
        r1 = min(f.shape[0], r0 + block)
        part = partials[b - first]  # the partials of the wave of blocks from ``first`` on
        part[:] = 0
        g_rows = np.empty((chunk, g.shape[1]), f.dtype)
        f_rows = np.empty((chunk, f.shape[1]), f.dtype)
        prods = np.empty((chunk, f.shape[1]), f.dtype)
        outer = np.empty((f.shape[1], g.shape[1]), f.dtype)
        if identity >= 0:
            np.dot(g[r0:r1], w_t[identity], grad_f[r0:r1])
            np.dot(f[r0:r1].T, g[r0:r1], part[identity])
        else:
            grad_f[r0:r1] = 0
        for t in range(todo.shape[0]):
            k = todo[t]
            start, end = bounds[k, b], bounds[k, b + 1]
            while start < end:
                n = min(end - start, chunk)
                # a bad source row is counted by its gather; the scatter skips it again without counting
                bad += _gather_rows(g_rows, g, pairs, k, dst_col, start, n, 0, g.shape[0])
                bad += _gather_rows(f_rows, f, pairs, k, src_col, start, n, r0, r1)
                np.dot(g_rows[:n], w_t[k], prods[:n])
                _scatter_add_rows(grad_f, prods, pairs, k, src_col, start, n, r0, r1)
                np.dot(f_rows[:n].T, g_rows[:n], outer)
                part[k] += outer
                start += n
    return bad


@njit
def _sum_in_order(partials, total):
    for b in range(partials.shape[0]):  # block order: the same sum on any thread count
        total += partials[b]


def _run_blocks(kernel, blocks: tuple[int, int], work: float, *args) -> int:
    """``kernel(*args, b_lo, b_hi)`` over the blocks ``[first, last)``, in ranges shared by the calling thread and the
    pool when the work (the whole call's) is worth waking it; the kernels' bad-index counts summed."""
    first, last = blocks
    threads = torch.get_num_threads()
    parts = guided_parts(last - first, threads, 1) if jit.use_parallel(work) else [(0, last - first)]
    parts = [(first + a, first + b) for a, b in parts]
    bad = []
    with _BLAS.limit(limits=1, user_api="blas"):
        run_parts(lambda lo, hi: bad.append(kernel(*args, lo, hi)), parts)
    return sum(bad)


def conv_forward(out, f, w, pairs, bounds, todo, identity: int, src_col: int, dst_col: int, block: int,
                 chunk: int) -> None:
    """``out`` = the sparse convolution over the map, blocks of ``block`` destination rows. ``bounds[k, b]``:
    the first pair of offset ``k`` in block ``b`` (pairs sorted by ``dst_col``); ``todo``: the offsets with
    pairs, ascending, the identity offset (initialising each block, or -1) excepted."""
    work = 2.0 * (float(bounds[:, -1].sum()) + (out.shape[0] if identity >= 0 else 0)) * f.shape[1] * w.shape[2]
    bad = _run_blocks(_conv_forward, (0, bounds.shape[1] - 1), work, numpy_alias(out), numpy_alias(f), numpy_alias(w),
                      numpy_alias(pairs), numpy_alias(bounds), todo, identity, src_col, dst_col, block, chunk)
    _raise_if_bad(bad, pairs, max(out.shape[0], f.shape[0]))


def conv_backward(grad_f, grad_w, g, f, w, pairs, bounds, todo, identity: int, src_col: int, dst_col: int,
                  block: int, chunk: int) -> None:
    """``grad_f`` and ``grad_w`` (zeroed by the caller) of :func:`conv_forward`, blocks of ``block`` source rows
    (pairs sorted by ``src_col``)."""
    n_blocks = bounds.shape[1] - 1
    # the blocks run in waves, each holding the weight-gradient partials of its blocks (at most PARTIAL_BYTES,
    # and blocks enough to share between the threads), added in block order: the same bits for any wave size
    wave = max(PARTIAL_BYTES // max(1, w.numel() * w.element_size()), 2 * torch.get_num_threads())
    partials = torch.empty((min(wave, n_blocks), *w.shape), dtype=w.dtype)
    work = 4.0 * (float(bounds[:, -1].sum()) + (f.shape[0] if identity >= 0 else 0)) * f.shape[1] * w.shape[2]
    # w transposed once ([K, C_out, C_in] contiguous): the products g_rows @ w[k].T read it row-major
    w_t = w.transpose(1, 2).contiguous()
    grad_f_np, partials_np, grad_w_np = (numpy_alias(t) for t in (grad_f, partials, grad_w))
    inputs = [numpy_alias(t) for t in (g, f, w_t, pairs, bounds)]
    bad = 0
    for first in range(0, n_blocks, wave):
        last = min(first + wave, n_blocks)
        bad += _run_blocks(_conv_backward, (first, last), work, grad_f_np, partials_np, first, *inputs, todo,
                           identity, src_col, dst_col, block, chunk)
        _sum_in_order(partials_np[:last - first], grad_w_np)
    _raise_if_bad(bad, pairs, max(g.shape[0], f.shape[0]))


def _per_offset(kernel, pairs: torch.Tensor, work: float, *args) -> None:
    """``kernel(*args, k_lo, k_hi)`` over the map's offsets: one offset a part on cvops's workers when the work
    is worth waking them, else one call."""
    K = pairs.shape[0]
    parts = [(k, k + 1) for k in range(K)] if jit.use_parallel(work) else [(0, K)]
    run_parts(lambda lo, hi: kernel(*args, lo, hi), parts)


@njit
def _block_bounds(pairs, counts, col, block_rows, bounds, ascending, k_lo, k_hi):
    n_blocks = bounds.shape[1] - 1
    for k in range(k_lo, k_hi):
        n = counts[k]
        rows = pairs[k, col, :n]
        descents = 0
        for i in range(1, n):  # branch-free, so it vectorises
            descents += rows[i] < rows[i - 1]
        ascending[k] = descents == 0
        for b in range(n_blocks + 1):
            bounds[k, b] = np.searchsorted(rows, b * block_rows) if b < n_blocks else n


def block_bounds(pairs: torch.Tensor, counts: torch.Tensor, col: int, block_rows: int, n_blocks: int):
    """``(bounds [K, n_blocks + 1], ascending)``: ``bounds[k, b]`` is the first pair of offset ``k`` whose
    ``pairs[k, col]`` row lies in block ``b`` (rows ``[b * block_rows, (b + 1) * block_rows)``), one pass
    over the map; ``ascending`` says whether every offset's column is sorted (else the bounds mean nothing)."""
    K = pairs.shape[0]
    bounds = torch.empty((K, n_blocks + 1), dtype=torch.int64)
    ascending = torch.empty(K, dtype=torch.bool)
    _per_offset(_block_bounds, pairs, int(counts.sum()), numpy_alias(pairs), numpy_alias(counts.to(torch.int64)),
                col, block_rows, numpy_alias(bounds), numpy_alias(ascending))
    return bounds, bool(ascending.all())


@njit
def _sort_by_column(pairs, counts, col, out, k_lo, k_hi):
    for k in range(k_lo, k_hi):
        n = counts[k]
        keys = pairs[k, col, :n]
        lo = np.int64(keys.min()) if n else np.int64(0)
        span = np.int64(keys.max()) - lo + 1 if n else np.int64(0)  # negative if it wraps: any int64 keys
        if 0 <= span <= 4 * n + 4096:  # row numbers: a stable counting sort, two passes
            starts = np.zeros(span + 1, np.int64)
            for i in range(n):
                starts[keys[i] - lo + 1] += 1
            for v in range(span):
                starts[v + 1] += starts[v]
            for i in range(n):
                slot = starts[keys[i] - lo]
                starts[keys[i] - lo] = slot + 1
                out[k, 0, slot] = pairs[k, 0, i]
                out[k, 1, slot] = pairs[k, 1, i]
        else:  # keys spread far wider than their count: a merge sort
            order = np.argsort(keys, kind="mergesort")
            for c in range(2):
                for i in range(n):
                    out[k, c, i] = pairs[k, c, order[i]]
        out[k, :, n:] = pairs[k, :, n:]


def sort_pairs_by_column(pairs: torch.Tensor, counts: torch.Tensor, col: int) -> torch.Tensor:
    """Each offset's valid pairs in ascending ``pairs[k, col]``, stable, the tail slots as they were: the result
    of ``kmap.sort_pairs_by_column``'s torch sort, without its int64 key copy. The keys are row numbers, so a
    counting sort orders an offset in two passes over its pairs and the rows they span."""
    out = torch.empty_like(pairs)
    _per_offset(_sort_by_column, pairs, int(counts.sum()) * 16, numpy_alias(pairs),
                numpy_alias(counts.to(torch.int64)), col, numpy_alias(out))
    return out
