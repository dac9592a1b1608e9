"""The ``torch`` backend of the sparse convolution: gather-GEMM-scatter in blocks of destination rows.

The ``numba`` backend (``cpu_numba``, the CPU default where numba is installed) runs each direction as one
compiled call; the torch loops below are the same algorithm, on any device:

    for each block of destination rows [r0, r1)  (the blocks run in parallel, one per core)
        for each round: the block's pairs, offsets ascending, cut into runs of at most CHUNK_BYTES rows
            rows = features[src]                 one gather for every offset of the round
            prods[offset k] = rows[k] @ weight[k] one mm per offset
            out[dst] += prods                    one scatter-add, offset after offset

Each offset's pairs are sorted by destination row (the layers pass maps in that order; others are
sorted here), so a block's pairs of one offset are one contiguous segment. Working block by block keeps
the block's output rows and the gathered rows / products in cache between the gather, the GEMM and the
scatter, instead of streaming offset-sized workspaces through memory three times; and the blocks need
no barrier between offsets, because no two blocks write the same row.

Determinism and thread count: the blocks and the rounds within a block have fixed sizes (they depend
on the channels and the dtype, never on the number of threads), each block runs single-threaded,
and within one offset every destination row occurs at most once. So every output element receives the
same additions in the same order (identity offset first, then ascending k) whichever thread runs its
block: the bits do not depend on the thread count. The weight gradient is a per-block partial, the
partials summed in block order. The compiled and torch paths differ only in their BLAS (SciPy's and
torch's), so they agree to rounding.

The subm identity offset (the pairs ``(i, i)`` for every row) is one dense matmul per block that
initialises the block. Half types are computed in float32 and rounded once at the end.
"""
from __future__ import annotations

import threading
from concurrent.futures import wait

import torch

from .._core.memory import new_empty
from .._core.parallel import pool, single_threaded
from .kmap import sort_pairs_by_column

BLOCK_BYTES = 1 << 20   # destination rows per block: this many bytes of output rows ...
BLOCK_ROWS = (1024, 16384)  # ... within these bounds
CHUNK_BYTES = 1 << 20   # the most pairs gathered per GEMM: this many bytes of the wider row side
MAX_AHEAD = 8  # backward: blocks a worker may run ahead of the oldest unfinished one


def _block_rows(channels: int, itemsize: int) -> int:
    lo, hi = BLOCK_ROWS
    return max(lo, min(hi, BLOCK_BYTES // max(1, channels * itemsize)))


def _chunk_rows(channels: int, itemsize: int) -> int:
    return max(1, CHUNK_BYTES // max(1, channels * itemsize))


def _gather(src: torch.Tensor, pairs: torch.Tensor, col: int, chunks, out: torch.Tensor) -> None:
    """``out[pos + i] = src[pairs[k, col, c0 + i]]`` for every chunk ``(k, c0, c1, pos)`` of a round."""
    for k, c0, c1, pos in chunks:
        torch.index_select(src, 0, pairs[k, col, c0:c1], out=out[pos:pos + c1 - c0])


def _scatter(out: torch.Tensor, pairs: torch.Tensor, col: int, chunks, rows: torch.Tensor) -> None:
    """``out[pairs[k, col, c0 + i]] += rows[pos + i]``, chunk by chunk in order."""
    for k, c0, c1, pos in chunks:
        out.index_add_(0, pairs[k, col, c0:c1].long(), rows[pos:pos + c1 - c0])


def _segments(pairs: torch.Tensor, counts: list[int], col: int, block_rows: int, n_blocks: int):
    """``(pairs, bounds)``: the map with each offset ascending in ``pairs[k, col]`` (sorted here if it is not)
    and ``bounds[k, b]`` (int64 on the CPU), the first pair of offset ``k`` in block ``b``
    (``bounds[k, -1] = n_k``)."""
    K = pairs.shape[0]
    num = torch.tensor(counts, dtype=torch.int64)
    for attempt in range(2):
        starts = torch.arange(n_blocks + 1, dtype=torch.int64, device=pairs.device) * block_rows
        rows, ascending = [], True
        for k in range(K):
            key = pairs[k, col, :counts[k]].long()
            ascending = ascending and bool((key[1:] >= key[:-1]).all())
            rows.append(torch.searchsorted(key, starts).clamp_(max=counts[k]))
            rows[-1][-1] = counts[k]
        bounds = torch.stack(rows).cpu() if rows else torch.zeros((0, n_blocks + 1), dtype=torch.int64)
        if ascending:
            return pairs, bounds
        pairs = sort_pairs_by_column(pairs, num.to(pairs.device), col, backend="torch")
    raise AssertionError("sorted pairs must be ascending")


def _run_blocks(n_blocks: int, body, make_scratch) -> None:
    """``body(b, scratch)`` for every block, blocks handed out in turn to one single-threaded worker per
    core (which worker runs a block does not change its result); ``make_scratch()`` once per worker."""
    threads = torch.get_num_threads()
    if threads <= 1 or n_blocks <= 1:
        scratch = make_scratch()
        for b in range(n_blocks):
            body(b, scratch)
        return
    lock = threading.Lock()
    blocks = iter(range(n_blocks))

    def work() -> None:
        torch.set_num_threads(1)
        scratch = make_scratch()
        with torch.no_grad():
            while True:
                with lock:
                    b = next(blocks, None)
                if b is None:
                    return
                try:
                    body(b, scratch)
                except BaseException:
                    with lock:  # the other workers stop at their next block
                        for _ in blocks:
                            pass
                    raise

    with single_threaded():
        futures = [pool(threads).submit(work) for _ in range(min(threads, n_blocks))]
        wait(futures)  # all workers are done before the thread count is restored
        for future in futures:
            future.result()


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _offsets(counts: list[int], identity_offset: int):
    """(k, n) for every offset with pairs, the identity offset excepted."""
    return [(k, n) for k, n in enumerate(counts) if n and k != identity_offset]


def _row_buffers(todo, chunk: int, dtype, device, *widths: int):
    """One ``[rows, c]`` work buffer per width c; rows: the most pairs one round holds."""
    rows = min(chunk, sum(n for _, n in todo))
    return tuple(torch.empty((rows, c), dtype=dtype, device=device) for c in widths)


def _rounds(todo, bounds, b: int, chunk: int):
    """The pairs of block ``b`` (offsets in ``todo`` order, each one's pairs whose blocking row lies in the
    block) in rounds of at most ``chunk`` pairs: each round a list of chunks ``(k, c0, c1, pos)``,
    the pairs ``c0:c1`` of offset ``k`` at rows ``pos:pos + c1 - c0`` of the round's work buffers."""
    round_, used = [], 0
    for k, _ in todo:
        start, end = bounds[k][b], bounds[k][b + 1]
        while start < end:
            if used == chunk:
                yield round_
                round_, used = [], 0
            stop = min(end, start + chunk - used)
            round_.append((k, start, stop, used))
            used += stop - start
            start = stop
    if round_:
        yield round_


def forward(features, weight, pairs, indice_num, num_out: int, inverse: bool, identity_offset: int):
    """``[num_out, C_out]``: the sparse convolution of ``features`` over the map."""
    ct = _compute_dtype(features.dtype)
    f, w = features.detach().to(ct).contiguous(), weight.detach().to(ct).contiguous()
    c_in, c_out = w.shape[1], w.shape[2]
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    counts = [int(c) for c in indice_num.tolist()]
    todo = _offsets(counts, identity_offset)
    out = new_empty((num_out, c_out), ct, f.device)
    itemsize = out.element_size()
    block = _block_rows(c_out, itemsize)
    n_blocks = -(-num_out // block)
    pairs, bounds = _segments(pairs, counts, dst_col, block, n_blocks)
    chunk = _chunk_rows(max(c_in, c_out), itemsize)
    bounds = bounds.tolist()

    def body(b, bufs):
        rows, prods = bufs
        r0, r1 = b * block, min(num_out, (b + 1) * block)
        if identity_offset >= 0:
            torch.mm(f[r0:r1], w[identity_offset], out=out[r0:r1])
        else:
            out[r0:r1].zero_()
        for chunks in _rounds(todo, bounds, b, chunk):
            _gather(f, pairs, src_col, chunks, rows)
            for k, c0, c1, pos in chunks:
                end = pos + c1 - c0
                torch.mm(rows[pos:end], w[k], out=prods[pos:end])
            _scatter(out, pairs, dst_col, chunks, prods)

    _run_blocks(n_blocks, body, lambda: _row_buffers(todo, chunk, ct, f.device, c_in, c_out))
    return out.to(features.dtype)


def backward(grad_out, features, weight, pairs, indice_num, inverse: bool, identity_offset: int):
    """``(grad_features, grad_weight)`` of :func:`forward`."""
    ct = _compute_dtype(features.dtype)
    g, f, w = (t.detach().to(ct).contiguous() for t in (grad_out, features, weight))
    K, c_in, c_out = w.shape
    n_rows = f.shape[0]
    src_col, dst_col = (1, 0) if inverse else (0, 1)
    counts = [int(c) for c in indice_num.tolist()]
    todo = _offsets(counts, identity_offset)
    grad_features = new_empty(tuple(f.shape), ct, f.device)
    grad_weight = torch.zeros_like(w)
    itemsize = grad_features.element_size()
    block = _block_rows(c_in, itemsize)
    n_blocks = -(-n_rows // block)
    # the input gradient scatters into the source rows: blocks of source rows
    pairs, bounds = _segments(pairs, counts, src_col, block, n_blocks)
    chunk = _chunk_rows(max(c_in, c_out), itemsize)
    bounds = bounds.tolist()
    # per-block weight-gradient partials, added to grad_weight in block order as blocks finish
    added = threading.Condition()
    finished: dict[int, torch.Tensor] = {}
    spare: list[torch.Tensor] = []
    next_block = [0]
    failed = [False]

    def add_in_order(b: int, partial: torch.Tensor) -> None:
        with added:
            finished[b] = partial
            while next_block[0] in finished:
                summed = finished.pop(next_block[0])
                grad_weight.add_(summed)
                spare.append(summed)
                next_block[0] += 1
            added.notify_all()

    def body(b, bufs):
        try:
            block_backward(b, *bufs)
        except BaseException:
            with added:  # no worker may wait for this block's partial
                failed[0] = True
                added.notify_all()
            raise

    def block_backward(b, g_rows, f_rows, prods):
        r0, r1 = b * block, min(n_rows, (b + 1) * block)
        with added:
            # bound the partials waiting for an earlier block (a descheduled worker) to MAX_AHEAD
            added.wait_for(lambda: b - next_block[0] <= MAX_AHEAD or failed[0])
            if failed[0]:
                return
            partial = spare.pop() if spare else None
        if partial is None:
            partial = torch.empty_like(w)
        if identity_offset >= 0:
            torch.mm(g[r0:r1], w[identity_offset].t(), out=grad_features[r0:r1])
            torch.mm(f[r0:r1].t(), g[r0:r1], out=partial[identity_offset])
        else:
            grad_features[r0:r1].zero_()
        done = {identity_offset}
        for chunks in _rounds(todo, bounds, b, chunk):
            _gather(g, pairs, dst_col, chunks, g_rows)
            for k, c0, c1, pos in chunks:
                end = pos + c1 - c0
                torch.mm(g_rows[pos:end], w[k].t(), out=prods[pos:end])
            _scatter(grad_features, pairs, src_col, chunks, prods)
            _gather(f, pairs, src_col, chunks, f_rows)
            for k, c0, c1, pos in chunks:
                end = pos + c1 - c0
                if k in done:
                    partial[k].addmm_(f_rows[pos:end].t(), g_rows[pos:end])
                else:
                    torch.mm(f_rows[pos:end].t(), g_rows[pos:end], out=partial[k])
                    done.add(k)
        for k in range(K):
            if k not in done:
                partial[k].zero_()
        add_in_order(b, partial)

    _run_blocks(n_blocks, body, lambda: _row_buffers(todo, chunk, ct, f.device, c_out, c_in, c_in))
    return grad_features.to(features.dtype), grad_weight.to(weight.dtype)
