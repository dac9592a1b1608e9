"""The shared CPU work split (``_core.parallel``): ranges that tile the work exactly once, and run_parts
calling every range once from however many threads."""
from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given, strategies as st

from cvops._core.parallel import even_parts, guided_parts, run_parts


def _tiles(parts, total):
    return parts[0][0] == 0 and parts[-1][1] == total and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


@given(st.integers(1, 10_000), st.integers(1, 64))
def test_even_parts_tile_the_range_in_near_equal_lengths(total, count):
    parts = even_parts(total, count)
    assert _tiles(parts, total) and len(parts) == min(count, total)
    lengths = [hi - lo for lo, hi in parts]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1


@given(st.integers(1, 10_000), st.integers(1, 16), st.integers(1, 32))
def test_guided_parts_tile_the_range_and_shrink(total, threads, smallest):
    parts = guided_parts(total, threads, smallest)
    assert _tiles(parts, total)
    lengths = [hi - lo for lo, hi in parts]
    assert all(a >= b for a, b in zip(lengths, lengths[1:-1]))  # non-increasing (the last one may be cut short)
    assert all(n >= smallest for n in lengths[:-1])


def test_guided_and_even_parts_of_nothing():
    assert even_parts(0, 4) == [] and guided_parts(0, 2, 1) == []


@pytest.mark.parametrize("threads", [1, 2])
def test_run_parts_calls_every_range_once(threads):
    seen, lock = [], threading.Lock()

    def call(lo, hi):
        with lock:
            seen.append((lo, hi))

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        parts = even_parts(1000, 16)
        run_parts(call, parts)
    finally:
        torch.set_num_threads(previous)
    assert sorted(seen) == parts
