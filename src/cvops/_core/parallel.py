"""cvops's one CPU thread pool (docs/ARCHITECTURE.md, ``_core``): compiled kernels that release the GIL run over
ranges of their work on the calling thread and torch's thread count of pool workers (:func:`run_parts`). A
forked child forgets its parent's pools and lock, and makes new ones on first use."""
from __future__ import annotations

import contextlib
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Sequence

import torch

_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def _forget_parent_threads() -> None:
    global _lock
    _pools.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_threads)


def _pool(workers: int) -> ThreadPoolExecutor:
    """The shared worker threads (one pool per size)."""
    if workers not in _pools:
        _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="cvops")
    return _pools[workers]


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Torch intra-op threading off for the block (the kernel map's one torch sort: no OpenMP region on a
    loaded machine). Restored afterwards; the lock keeps concurrent callers from restoring each other's
    setting."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    with _lock:
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def even_parts(total: int, count: int) -> list[tuple[int, int]]:
    """``[0, total)`` cut into ``min(count, total)`` non-empty ranges of near-equal length."""
    if total <= 0:
        return []
    count = max(1, min(count, total))
    bounds = [total * i // count for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def guided_parts(total: int, threads: int, smallest: int) -> list[tuple[int, int]]:
    """``[0, total)`` in ranges of decreasing length, each ``1 / (2 * threads)`` of what is left (at least
    ``smallest``): few ranges, and a thread that starts late or runs slowly holds the others up at the end
    by a short one."""
    parts, lo = [], 0
    while lo < total:
        hi = min(total, lo + max(smallest, -(-(total - lo) // (2 * threads))))
        parts.append((lo, hi))
        lo = hi
    return parts


def run_parts(call: Callable[[int, int], None], parts: Sequence[tuple[int, int]]) -> None:
    """``call(lo, hi)`` for every range of ``parts``, claimed one by one by the calling thread and torch's
    thread count of pool workers, for compiled kernels that release the GIL and write disjoint outputs.
    Parts are claimed as threads come free, so a descheduled thread holds up one part, not a fixed share.
    One thread or one part runs on the calling thread alone."""
    threads = torch.get_num_threads()
    if threads < 2 or len(parts) < 2:
        for lo, hi in parts:
            call(lo, hi)
        return
    claim = itertools.count()

    def take() -> None:
        i = next(claim)  # itertools.count is atomic under the GIL
        while i < len(parts):
            call(*parts[i])
            i = next(claim)

    helpers = [_pool(threads).submit(take) for _ in range(threads - 1)]
    try:
        take()
    finally:  # the kernels hold the caller's buffers: wait for every helper, even after an error here
        for helper in helpers:  # every part is claimed: a helper still queued has nothing left to do
            if not helper.cancel():
                helper.result()
