"""The shared CPU work split (``_core.parallel``): ranges that tile the work exactly once, run_parts
calling every range once from however many threads, and a forked child running split work."""
from __future__ import annotations

import os
import subprocess
import sys
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


_FORK = """
import os, sys, time, torch
from cvops._core.parallel import even_parts, run_parts
torch.set_num_threads(2)
for _ in range(5):                                  # the pool's threads start, work and go idle here
    run_parts(lambda lo, hi: time.sleep(0.01), even_parts(8, 8))
pid = os.fork()
if pid == 0:                                        # the child has none of them
    seen = []
    run_parts(lambda lo, hi: seen.append(lo), even_parts(8, 8))
    os._exit(0 if sorted(seen) == list(range(8)) else 3)
deadline = time.monotonic() + 30
while (finished := os.waitpid(pid, os.WNOHANG))[0] == 0:
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        sys.exit("the child waits for pool threads it does not have")
    time.sleep(0.02)
sys.exit(os.waitstatus_to_exitcode(finished[1]))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_split_work_on_threads_of_its_own():
    # a child used to hand its work to the parent's pool, whose threads it does not have, and wait for ever
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    done = subprocess.run([sys.executable, "-c", _FORK], env=dict(os.environ, PYTHONPATH=src),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
