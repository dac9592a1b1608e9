"""The regular and transposed (strided) kernel map as numba loops over an occupancy bitmap of the output grid.

Output cells have row-major linear keys ``key(b, o) = b * V + sum_d o_d * S_d``. Instead of sorting the
candidate keys (``cpu.py``'s ``unique``), the passes visit only the (row, offset) slots that land on the
grid, from a table per dimension that lists each input coordinate's valid taps as shares of the offset
index and of the output key (``cpu.tap_positions``' rules; one division per coordinate, none per row):

1. mark (serial: rows share bitmap words): every slot sets its cell's bit and counts its offset per chunk;
2. rank: ``prefix[w]``, the set bits before word w, so a cell's output row is ``prefix[w]`` + the set bits
   below it in its word: rows ascend with the key, ``unique``'s order;
3. pairs, in parallel over chunks of rows: each chunk knows from the counts where its pairs of every
   offset start and lists its rows ascending, as ``pack_pairs`` does; then the -1 tails;
4. ``out_indices``: the set bits in order, unravelled, in parallel over ranges of words.

The result is the torch code's, bit for bit. :func:`bitmap_sizes` takes the bitmap only where it and the
tables take no more memory than the sort's ``8 * L * K`` bytes of keys.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..._core.bits import numpy_alias
from ..._core.jit import inline, njit, use_parallel
from ..._core.memory import new_empty
from ..._core.parallel import even_parts, run_parts
from . import cpu
from .checks import INT32_LIMIT, MAX_NDIM, leading_ones  # output rows are int32, and so is the prefix count

WORD_BITS = 64
# rows of the geometry table handed to the kernels (one column per spatial dimension)
OUT_SHAPE, OUT_STRIDE, KERNEL, STRIDE, PAD, DIL, OFFSET_STRIDE = range(7)


@inline
def _popcount(word):
    """Set bits of an int64 (SWAR: the masks clear what an arithmetic shift drags in)."""
    word = word - ((word >> 1) & 0x5555555555555555)
    word = (word & 0x3333333333333333) + ((word >> 2) & 0x3333333333333333)
    word = (word + (word >> 4)) & 0x0F0F0F0F0F0F0F0F
    return (word * 0x0101010101010101) >> 56


@njit
def _tap_tables(geo, in_shape, transpose, table_count, table_offset, table_key):
    """Per dimension d and coordinate p (row ``row_base[d] + p``): the valid taps, each as its share of the
    offset index and of the output key. One division per coordinate here, none per input row later."""
    row = 0
    for d in range(geo.shape[1]):
        size, s, pad, dil = geo[OUT_SHAPE, d], geo[STRIDE, d], geo[PAD, d], geo[DIL, d]
        for p in range(in_shape[d]):
            n = 0
            if transpose or s == 1:
                first, step = (p * s - pad, dil) if transpose else (p + pad, -dil)
                for t in range(geo[KERNEL, d]):
                    o = first + t * step
                    if 0 <= o < size:
                        table_offset[row, n] = t * geo[OFFSET_STRIDE, d]
                        table_key[row, n] = o * geo[OUT_STRIDE, d]
                        n += 1
            else:
                num = p + pad
                o = num // s  # floor: the taps t = num - o * s, + s, ... reach o, o - 1, ...
                t = num - o * s
                while t < geo[KERNEL, d] and o >= 0:
                    if o < size:
                        table_offset[row, n] = t * geo[OFFSET_STRIDE, d]
                        table_key[row, n] = o * geo[OUT_STRIDE, d]
                        n += 1
                    t += s
                    o -= 1
            table_count[row] = n
            row += 1


@njit
def _rank(bits, prefix):
    count = 0
    for w in range(bits.shape[0]):
        prefix[w] = count
        count += _popcount(bits[w])
    return count


@njit
def _slots(coords, row_base, volume, table_count, table_offset, table_key, bits, prefix, chunk_rows, cursors, pairs,
           c_lo, c_hi):
    """Every (row, offset) slot of the rows of chunks ``[c_lo, c_hi)``, rows ascending. Without ``pairs``
    (None: numba compiles that branch away) each slot sets its bit and counts its offset k in ``cursors[c, k]``
    (zeros on entry); with them it writes its pair at ``cursors[c, k]`` (where chunk c's pairs of offset k
    start) and moves it on."""
    for c in range(c_lo, c_hi):
        cursor = cursors[c]
        for i in range(c * chunk_rows, min(coords.shape[0], (c + 1) * chunk_rows)):
            r0, r1 = row_base[0] + coords[i, 1], row_base[1] + coords[i, 2]
            r2, r3 = row_base[2] + coords[i, 3], row_base[3] + coords[i, 4]
            batch_key = coords[i, 0] * volume
            for a in range(table_count[r0]):
                k0, key0 = table_offset[r0, a], batch_key + table_key[r0, a]
                for b in range(table_count[r1]):
                    k1, key1 = k0 + table_offset[r1, b], key0 + table_key[r1, b]
                    for e in range(table_count[r2]):
                        k2, key2 = k1 + table_offset[r2, e], key1 + table_key[r2, e]
                        for f in range(table_count[r3]):
                            k, key = k2 + table_offset[r3, f], key2 + table_key[r3, f]
                            w = key >> 6
                            if pairs is not None:
                                pairs[k, 0, cursor[k]] = i
                                pairs[k, 1, cursor[k]] = prefix[w] + _popcount(bits[w] & ~(np.int64(-1) << (key & 63)))
                            else:
                                bits[w] |= np.int64(1) << (key & 63)
                            cursor[k] += 1


@njit
def _tails(pairs, counts, k_lo, k_hi):
    for k in range(k_lo, k_hi):
        pairs[k, :, counts[k]:] = -1


@inline
def _unravel_line(line, out_shape, site):
    """``site[:-1]`` = (b, *coords but the last) of grid line ``line`` (a key over all but the last dimension)."""
    for d in range(out_shape.shape[0] - 2, -1, -1):
        site[d + 1] = line % out_shape[d]
        line //= out_shape[d]
    site[0] = line


@njit
def _sites(bits, prefix, out_shape, out, w_lo, w_hi):
    # keys ascend, so the line (all coordinates but the last) changes rarely: a division per set word and
    # per line rather than per dimension of every site
    nd = out_shape.shape[0]
    width = out_shape[nd - 1]
    site = np.empty(nd + 1, dtype=np.int64)
    current = -1
    for w in range(w_lo, w_hi):
        word = bits[w]
        if word == 0:
            continue
        row = prefix[w]
        line = (w * 64) // width
        x = w * 64 - line * width
        previous = 0
        while word != 0:
            lowest = word & -word
            bit = _popcount(lowest - 1)
            x += bit - previous
            previous = bit
            while x >= width:
                x -= width
                line += 1
            if line != current:
                _unravel_line(line, out_shape, site)
                current = line
            for d in range(nd):
                out[row, d] = site[d]
            out[row, nd] = x
            row += 1
            word ^= lowest


def _bitmap_shape(indices: torch.Tensor, geo) -> tuple[int, int, int]:
    """Words of the bitmap (over batches up to the largest batch index), rows of the tap tables (the padded
    input shape's coordinates) and taps per row. The batch scan is numpy's, so no OpenMP region."""
    cells = (int(numpy_alias(indices)[:, 0].max()) + 1) * cpu.grid_strides(geo.out_spatial_shape)[1]
    return -(-cells // WORD_BITS), sum(geo.spatial_shape) + MAX_NDIM - geo.ndim, max(geo.kernel_size)


def bitmap_sizes(indices: torch.Tensor, geo) -> Optional[tuple[int, int, int]]:
    """:func:`_bitmap_shape`, or None where its arrays (bitmap, prefix and tables) take more than the sort's
    ``8 * L * K`` bytes of keys, or an output row could pass int32."""
    L, K = indices.shape[0], geo.kernel_volume
    words, table_rows, taps = sizes = _bitmap_shape(indices, geo)
    if L * K >= INT32_LIMIT or words * (8 + 4) + table_rows * (1 + 2 * taps) * 8 > 8 * L * K:
        return None
    return sizes


def _padded(geo) -> tuple[np.ndarray, np.ndarray]:
    """The geometry table and input shape of ``geo`` padded to 4-D (:func:`checks.leading_ones`)."""
    out_shape, kernel = leading_ones(geo.out_spatial_shape), leading_ones(geo.kernel_size)
    table = np.array([out_shape, cpu.grid_strides(out_shape)[0], kernel, leading_ones(geo.stride),
                      leading_ones(geo.padding, 0), leading_ones(geo.dilation), cpu.grid_strides(kernel)[0]],
                     dtype=np.int64)
    return table, np.asarray(leading_ones(geo.spatial_shape), dtype=np.int64)


def strided_pairs(indices: torch.Tensor, geo, sizes: Optional[tuple[int, int, int]] = None):
    """``(out_indices, indice_pairs, indice_num)`` of a regular or transposed map of CPU ``indices``;
    ``sizes``: :func:`bitmap_sizes` where already known (None: computed, whatever they come to)."""
    L, K, nd = indices.shape[0], geo.kernel_volume, geo.ndim
    # numpy for the scratch work: torch's intra-op threads would open OpenMP regions, which on a loaded
    # machine wait on the scheduler; the loops share out their work over run_parts instead
    rows = numpy_alias(indices)
    coords = np.zeros((L, MAX_NDIM + 1), dtype=np.int64)
    coords[:, 0] = rows[:, 0]
    coords[:, MAX_NDIM + 1 - nd:] = rows[:, 1:]
    volume = cpu.grid_strides(geo.out_spatial_shape)[1]
    words, table_rows, taps = sizes or _bitmap_shape(indices, geo)
    tables = (np.empty(table_rows, dtype=np.int64), np.empty((table_rows, taps), dtype=np.int64),
              np.empty((table_rows, taps), dtype=np.int64))
    table, in_shape = _padded(geo)
    _tap_tables(table, in_shape, geo.transpose, *tables)
    row_base = np.cumsum(in_shape) - in_shape  # first table row of each dimension
    threads = torch.get_num_threads() if use_parallel(L * K * 4) else 1
    chunks = 4 * threads if threads > 1 else 1  # several per thread: a late thread holds up a short one
    chunk_rows = -(-L // chunks)

    bits, prefix = np.zeros(words, dtype=np.int64), np.empty(words, dtype=np.int32)
    chunk_counts = np.zeros((chunks, K), dtype=np.int64)
    pairs = new_empty((K, 2, L), torch.int32)
    pairs_np = numpy_alias(pairs)
    args = (coords, row_base, volume, *tables, bits, prefix, chunk_rows)
    _slots(*args, chunk_counts, None, 0, chunks)  # serial: rows of different chunks share words
    num_out = _rank(bits, prefix)

    counts = chunk_counts.sum(0)
    chunk_starts = np.cumsum(chunk_counts, 0) - chunk_counts  # where each chunk's pairs of an offset begin
    run_parts(lambda lo, hi: _slots(*args, chunk_starts, pairs_np, lo, hi), [(c, c + 1) for c in range(chunks)])
    run_parts(lambda lo, hi: _tails(pairs_np, counts, lo, hi), even_parts(K, threads))

    out = new_empty((num_out, nd + 1), torch.int32)
    site_args = (bits, prefix, np.asarray(geo.out_spatial_shape, dtype=np.int64), numpy_alias(out))
    run_parts(lambda lo, hi: _sites(*site_args, lo, hi), even_parts(words, chunks))
    return out, pairs, torch.from_numpy(counts.astype(np.int32))
