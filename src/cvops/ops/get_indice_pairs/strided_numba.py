"""The regular and transposed (strided) kernel map as numba loops over an occupancy bitmap of the output grid.

Output cells have row-major linear keys ``key(b, o) = b * V + sum_d o_d * S_d`` over ``(batches, *out_shape)``.
Instead of sorting the ``L * K`` candidate keys (``cpu.py``'s ``unique``), the map is built in four passes:

1. taps: per dimension d, row i and tap t, the key part ``o_d * S_d`` (dimension 0 adds ``b * V``) or -1
   where the tap misses the grid (``cpu.tap_positions``' rules: exact division by the stride, bounds; the
   transposed positions ``p * s - pad + t * dil``); parallel over rows;
2. mark: every valid (offset, row) slot sets the bit of its output cell. Serial: slots of different rows
   share bitmap words, and a parallel mark would race on them;
3. rank: ``prefix[w]``, the set bits in the words before word w, so the output row of a marked cell is
   ``prefix[w] + popcount(word & bits below)``: rows ascend with the key, which is ``unique``'s order;
4. pairs, per offset (offsets shared over ``_core.parallel.run_parts``, each writing its own slices), rows
   ascending: ``(row, rank(cell))``, ``pack_pairs``' order, -1 after; and ``out_indices``, the set bits in
   order unravelled to ``(b, *coords)``, in parallel over ranges of words.

The result is the torch code's, bit for bit. The bitmap costs ``cells / 8`` bytes and the prefix 4 bytes a
word; :func:`fits` takes it only where that is at most the sort's ``8 * L * K`` bytes of keys. The batch count
is the largest batch index + 1, so a generous ``batch_size`` costs nothing.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._core.bits import numpy_alias
from ..._core.jit import inline, njit, use_parallel
from ..._core.parallel import even_parts, run_parts, single_threaded
from . import cpu

WORD_BITS = 64
INT32_LIMIT = 1 << 31  # output rows are int32, and so is the prefix count


@inline
def _popcount(word):
    """Set bits of an int64 (SWAR: the masks clear what an arithmetic shift drags in)."""
    word = word - ((word >> 1) & 0x5555555555555555)
    word = (word & 0x3333333333333333) + ((word >> 2) & 0x3333333333333333)
    word = (word + (word >> 4)) & 0x0F0F0F0F0F0F0F0F
    return (word * 0x0101010101010101) >> 56


@inline
def _slot_key(parts, tap_rows, i):
    """Linear key of row i's cell under the offset whose tap rows are ``tap_rows``, or -1 off the grid."""
    key = 0
    for d in range(tap_rows.shape[0]):
        part = parts[tap_rows[d], i]
        if part < 0:
            return -1
        key += part
    return key


@inline
def _offset_taps(k, kernel, tap_base, tap_rows):
    """Rows of ``parts`` holding offset k's taps (the last dimension fastest, ``itertools.product``'s order)."""
    for d in range(kernel.shape[0] - 1, -1, -1):
        tap_rows[d] = tap_base[d] + k % kernel[d]
        k //= kernel[d]


@njit
def _tap_parts(coords, out_shape, out_strides, volume, kernel, stride, pad, dil, transpose, tap_base, parts,
               lo, hi):
    nd = out_shape.shape[0]
    for i in range(lo, hi):
        for d in range(nd):
            p = coords[i, d + 1]
            for t in range(kernel[d]):
                if transpose:
                    o = p * stride[d] - pad[d] + t * dil[d]
                else:
                    num = p + pad[d] - t * dil[d]
                    o = num // stride[d]
                    if num < 0 or o * stride[d] != num:
                        o = -1
                part = -1
                if 0 <= o < out_shape[d]:
                    part = o * out_strides[d]
                    if d == 0:
                        part += coords[i, 0] * volume   # the batch term rides on dimension 0
                parts[tap_base[d] + t, i] = part


@njit
def _mark(parts, kernel, tap_base, bits):
    K = 1
    for d in range(kernel.shape[0]):
        K *= kernel[d]
    tap_rows = np.empty(kernel.shape[0], dtype=np.int64)
    for k in range(K):
        _offset_taps(k, kernel, tap_base, tap_rows)
        for i in range(parts.shape[1]):
            key = _slot_key(parts, tap_rows, i)
            if key >= 0:
                bits[key >> 6] |= np.int64(1) << (key & 63)


@njit
def _rank(bits, prefix):
    count = 0
    for w in range(bits.shape[0]):
        prefix[w] = count
        count += _popcount(bits[w])
    return count


@njit
def _offset_pairs(parts, position, kernel, tap_base, bits, prefix, pairs, counts, k_lo, k_hi):
    L = parts.shape[1]
    tap_rows = np.empty(kernel.shape[0], dtype=np.int64)
    found = np.empty(L, dtype=np.int64)  # by sorted position: the output row, or -1
    for k in range(k_lo, k_hi):
        _offset_taps(k, kernel, tap_base, tap_rows)
        for s in range(L):  # in key order: the bitmap is read nearly sequentially
            key = _slot_key(parts, tap_rows, s)
            if key < 0:
                found[s] = -1
            else:
                w = key >> 6
                found[s] = prefix[w] + _popcount(bits[w] & ~(np.int64(-1) << (key & 63)))
        n = 0
        for i in range(L):  # in row order: the packed order
            j = found[position[i]]
            if j >= 0:
                pairs[k, 0, n] = i
                pairs[k, 1, n] = j
                n += 1
        counts[k] = n
        pairs[k, :, n:] = -1


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


def _vec(values):
    return np.asarray(values, dtype=np.int64)


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


def strided_pairs(indices: torch.Tensor, geo):
    """``(out_indices, indice_pairs, indice_num)`` of a regular or transposed map of CPU ``indices``."""
    L, K, nd = indices.shape[0], geo.kernel_volume, geo.ndim
    # rows in input-key order: an offset then moves them to nearly ascending output keys, so marking and
    # ranking walk the bitmap (megabytes, beyond the core's cache) nearly in order instead of at random
    with single_threaded():
        order = torch.sort(cpu.site_keys(indices, geo.spatial_shape)).indices
    coords = indices.to(torch.int64).index_select(0, order)
    position = torch.empty_like(order)
    position[order] = torch.arange(L, dtype=torch.int64)
    del order
    out_strides, volume = cpu.grid_strides(geo.out_spatial_shape)
    kernel = _vec(geo.kernel_size)
    tap_base = _vec(np.cumsum([0] + list(geo.kernel_size[:-1])))
    parallel = use_parallel(L * K * 4)

    parts = torch.empty((int(kernel.sum()), L), dtype=torch.int64)
    args = (numpy_alias(coords), _vec(geo.out_spatial_shape), _vec(out_strides), volume, kernel,
            _vec(geo.stride), _vec(geo.padding), _vec(geo.dilation), geo.transpose, tap_base, numpy_alias(parts))
    run_parts(lambda lo, hi: _tap_parts(*args, lo, hi), even_parts(L, 8) if parallel else [(0, L)])
    del coords

    words = -(-batch_count(indices) * volume // WORD_BITS)
    bits = torch.zeros(words, dtype=torch.int64)
    prefix = torch.empty(words, dtype=torch.int32)
    parts_np, bits_np, prefix_np = numpy_alias(parts), numpy_alias(bits), numpy_alias(prefix)
    _mark(parts_np, kernel, tap_base, bits_np)
    num_out = _rank(bits_np, prefix_np)

    pairs = torch.empty((K, 2, L), dtype=torch.int32)
    counts = torch.empty(K, dtype=torch.int32)
    pair_args = (parts_np, numpy_alias(position), kernel, tap_base, bits_np, prefix_np, numpy_alias(pairs),
                 numpy_alias(counts))
    run_parts(lambda lo, hi: _offset_pairs(*pair_args, lo, hi),
              [(k, k + 1) for k in range(K)] if parallel else [(0, K)])
    del parts, parts_np

    out = torch.empty((num_out, nd + 1), dtype=torch.int32)
    site_args = (bits_np, prefix_np, _vec(geo.out_spatial_shape), numpy_alias(out))
    run_parts(lambda lo, hi: _sites(*site_args, lo, hi), even_parts(words, 8) if parallel else [(0, words)])
    return out, pairs, counts
