"""The regular and transposed (strided) kernel map as numba loops over an occupancy bitmap of the output grid.

Output cells have row-major linear keys ``key(b, o) = b * V + sum_d o_d * S_d`` over ``(batches, *out_shape)``.
Instead of sorting the candidate keys (``cpu.py``'s ``unique``), the map is built in four passes, each
visiting only the (row, offset) slots that land on the grid: per dimension, a row's valid taps follow from
one division (``cpu.tap_positions``' rules: with stride s > 1 the dilation is 1, so the taps ``t`` with
``p + pad - t`` divisible by s are every s-th from ``(p + pad) mod s``; transposed positions are
``p * s - pad + t * dil``), and the offsets of the row are their product.

1. mark: every slot sets the bit of its output cell, and counts its offset within its chunk of rows.
   Serial: slots of different rows share bitmap words, and a parallel mark would race on them;
2. rank: ``prefix[w]``, the set bits in the words before word w, so the output row of a marked cell is
   ``prefix[w] + popcount(word & bits below)``: rows ascend with the key, which is ``unique``'s order;
3. pairs, in parallel over chunks of rows: each chunk knows from the counts where its pairs of every
   offset start, and lists its rows ascending, as ``pack_pairs`` does; then the -1 tails, per offset;
4. ``out_indices``: the set bits in order, unravelled to ``(b, *coords)``, in parallel over ranges of words.

The result is the torch code's, bit for bit. The bitmap costs ``cells / 8`` bytes and the prefix 4 bytes a
word; :func:`fits` takes it only where that is at most the sort's ``8 * L * K`` bytes of keys. The batch count
is the largest batch index + 1, so a generous ``batch_size`` costs nothing.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._core.bits import numpy_alias
from ..._core.jit import inline, njit, use_parallel
from ..._core.parallel import even_parts, run_parts
from . import cpu

WORD_BITS = 64
INT32_LIMIT = 1 << 31  # output rows are int32, and so is the prefix count
# rows of the geometry table handed to the kernels (one column per spatial dimension)
OUT_SHAPE, OUT_STRIDE, KERNEL, STRIDE, PAD, DIL, OFFSET_STRIDE = range(7)


@inline
def _popcount(word):
    """Set bits of an int64 (SWAR: the masks clear what an arithmetic shift drags in)."""
    word = word - ((word >> 1) & 0x5555555555555555)
    word = (word & 0x3333333333333333) + ((word >> 2) & 0x3333333333333333)
    word = (word + (word >> 4)) & 0x0F0F0F0F0F0F0F0F
    return (word * 0x0101010101010101) >> 56


@inline
def _row_taps(coords, i, geo, volume, transpose, offset_of, key_of, count):
    """Row i's valid taps per dimension d: ``count[d]`` of them, each as its share of the offset index
    (``offset_of[d, n]``) and of the output key (``key_of[d, n]``). False when a dimension has none."""
    for d in range(geo.shape[1]):
        size, s, pad, dil = geo[OUT_SHAPE, d], geo[STRIDE, d], geo[PAD, d], geo[DIL, d]
        p = coords[i, d + 1]
        n = 0
        if transpose or s == 1:
            first, step = (p * s - pad, dil) if transpose else (p + pad, -dil)
            for t in range(geo[KERNEL, d]):
                o = first + t * step
                if 0 <= o < size:
                    offset_of[d, n] = t
                    key_of[d, n] = o
                    n += 1
        else:
            num = p + pad
            o = num // s  # floor: the taps t = num - o * s, + s, ... reach o, o - 1, ...
            t = num - o * s
            while t < geo[KERNEL, d] and o >= 0:
                if o < size:
                    offset_of[d, n] = t
                    key_of[d, n] = o
                    n += 1
                t += s
                o -= 1
        if n == 0:
            return False
        for m in range(n):
            offset_of[d, m] *= geo[OFFSET_STRIDE, d]
            key_of[d, m] *= geo[OUT_STRIDE, d]
        count[d] = n
    base = coords[i, 0] * volume  # the batch term rides on dimension 0
    for m in range(count[0]):
        key_of[0, m] += base
    return True


@inline
def _next_slot(pick, count):
    """Advances the odometer ``pick`` over the product of the dimensions' taps; False after the last."""
    for d in range(pick.shape[0] - 1, -1, -1):
        pick[d] += 1
        if pick[d] < count[d]:
            return True
        pick[d] = 0
    return False


@njit
def _mark(coords, geo, volume, transpose, bits, chunk_counts, chunk_rows):
    nd, max_taps = geo.shape[1], geo[KERNEL].max()
    offset_of = np.empty((nd, max_taps), dtype=np.int64)
    key_of = np.empty((nd, max_taps), dtype=np.int64)
    count = np.empty(nd, dtype=np.int64)
    pick = np.zeros(nd, dtype=np.int64)
    chunk_counts[:] = 0
    for i in range(coords.shape[0]):
        if not _row_taps(coords, i, geo, volume, transpose, offset_of, key_of, count):
            continue
        c = i // chunk_rows
        while True:
            k, key = 0, 0
            for d in range(nd):
                k += offset_of[d, pick[d]]
                key += key_of[d, pick[d]]
            bits[key >> 6] |= np.int64(1) << (key & 63)
            chunk_counts[c, k] += 1
            if not _next_slot(pick, count):
                break


@njit
def _rank(bits, prefix):
    count = 0
    for w in range(bits.shape[0]):
        prefix[w] = count
        count += _popcount(bits[w])
    return count


@njit
def _chunk_pairs(coords, geo, volume, transpose, bits, prefix, chunk_starts, chunk_rows, pairs, c_lo, c_hi):
    nd, max_taps = geo.shape[1], geo[KERNEL].max()
    offset_of = np.empty((nd, max_taps), dtype=np.int64)
    key_of = np.empty((nd, max_taps), dtype=np.int64)
    count = np.empty(nd, dtype=np.int64)
    pick = np.zeros(nd, dtype=np.int64)
    for c in range(c_lo, c_hi):
        cursor = chunk_starts[c].copy()
        for i in range(c * chunk_rows, min(coords.shape[0], (c + 1) * chunk_rows)):
            if not _row_taps(coords, i, geo, volume, transpose, offset_of, key_of, count):
                continue
            while True:
                k, key = 0, 0
                for d in range(nd):
                    k += offset_of[d, pick[d]]
                    key += key_of[d, pick[d]]
                w = key >> 6
                pairs[k, 0, cursor[k]] = i
                pairs[k, 1, cursor[k]] = prefix[w] + _popcount(bits[w] & ~(np.int64(-1) << (key & 63)))
                cursor[k] += 1
                if not _next_slot(pick, count):
                    break


@njit
def _tails(pairs, counts, k_lo, k_hi):
    for k in range(k_lo, k_hi):
        pairs[k, :, counts[k]:] = -1


@njit
def _sites(bits, prefix, out_shape, out, w_lo, w_hi):
    nd = out_shape.shape[0]
    for w in range(w_lo, w_hi):
        word = bits[w]
        row = prefix[w]
        while word != 0:
            lowest = word & -word
            key = w * 64 + _popcount(lowest - 1)
            for d in range(nd - 1, -1, -1):
                out[row, d + 1] = key % out_shape[d]
                key //= out_shape[d]
            out[row, 0] = key
            row += 1
            word ^= lowest


def batch_count(indices: torch.Tensor) -> int:
    """The largest batch index + 1 (``indices`` non-empty)."""
    return int(indices[:, 0].max()) + 1


def fits(indices: torch.Tensor, geo) -> bool:
    """Whether the bitmap and its prefix take at most the sort's ``8 * L * K`` bytes of keys (and every
    output row fits int32)."""
    L, K = indices.shape[0], geo.kernel_volume
    cells = batch_count(indices) * cpu.grid_strides(geo.out_spatial_shape)[1]
    words = -(-cells // WORD_BITS)
    return L * K < INT32_LIMIT and words * (8 + 4) <= 8 * L * K


def _geometry_table(geo) -> np.ndarray:
    out_strides, _ = cpu.grid_strides(geo.out_spatial_shape)
    offset_strides, _ = cpu.grid_strides(geo.kernel_size)  # offsets are row-major over the kernel
    return np.array([geo.out_spatial_shape, out_strides, geo.kernel_size, geo.stride, geo.padding,
                     geo.dilation, offset_strides], dtype=np.int64).reshape(7, geo.ndim)


def strided_pairs(indices: torch.Tensor, geo):
    """``(out_indices, indice_pairs, indice_num)`` of a regular or transposed map of CPU ``indices``."""
    L, K, nd = indices.shape[0], geo.kernel_volume, geo.ndim
    coords = numpy_alias(indices.to(torch.int64).contiguous())
    table = _geometry_table(geo)
    volume = cpu.grid_strides(geo.out_spatial_shape)[1]
    threads = torch.get_num_threads() if use_parallel(L * K) else 1
    chunks = 4 * threads if threads > 1 else 1  # several per thread: a late thread holds up a short one
    chunk_rows = -(-L // chunks)

    words = -(-batch_count(indices) * volume // WORD_BITS)
    bits = torch.zeros(words, dtype=torch.int64)
    prefix = torch.empty(words, dtype=torch.int32)
    bits_np, prefix_np = numpy_alias(bits), numpy_alias(prefix)
    chunk_counts = np.empty((chunks, K), dtype=np.int64)
    _mark(coords, table, volume, geo.transpose, bits_np, chunk_counts, chunk_rows)
    num_out = _rank(bits_np, prefix_np)

    counts = chunk_counts.sum(0)
    chunk_starts = np.cumsum(chunk_counts, 0) - chunk_counts  # where each chunk's pairs of an offset begin
    pairs = torch.empty((K, 2, L), dtype=torch.int32)
    pairs_np = numpy_alias(pairs)
    args = (coords, table, volume, geo.transpose, bits_np, prefix_np, chunk_starts, chunk_rows, pairs_np)
    run_parts(lambda lo, hi: _chunk_pairs(*args, lo, hi), [(c, c + 1) for c in range(chunks)])
    run_parts(lambda lo, hi: _tails(pairs_np, counts, lo, hi), even_parts(K, threads))

    out = torch.empty((num_out, nd + 1), dtype=torch.int32)
    site_args = (bits_np, prefix_np, table[OUT_SHAPE].copy(), numpy_alias(out))
    run_parts(lambda lo, hi: _sites(*site_args, lo, hi), even_parts(words, chunks))
    return out, pairs, torch.from_numpy(counts.astype(np.int32))
