"""Run many small independent torch ops on all CPU cores without a barrier per op.

Each torch CPU op parallelises internally (OpenMP) and ends in a barrier. A loop of hundreds of
small ops (batched products over chunks that fit in cache) therefore waits at hundreds of barriers;
on a busy machine a descheduled worker makes every one of them late, and the loop can run several
times slower than one thread. :func:`run_split` instead gives each core its own share of the ops,
run single-threaded, and joins once.

The intra-op thread count is process-global in torch, so it is lowered to 1 for the duration of the
call and restored afterwards; a lock keeps concurrent callers from interleaving that. Torch ops that
other threads run meanwhile run single-threaded (slower, never wrong).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import torch

_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    if workers not in _pools:
        _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="cvops")
    return _pools[workers]


def run_split(items: Sequence, body: Callable[[object], None]) -> None:
    """Call ``body(item)`` for every item, items dealt round-robin to one single-threaded worker per core.

    Falls back to a plain loop (with torch's own threading) for one thread or one item.
    """
    threads = torch.get_num_threads()
    if threads <= 1 or len(items) <= 1:
        for item in items:
            body(item)
        return

    # grad and inference modes are thread-local: the workers run in the caller's modes
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def share(part: int) -> None:
        torch.set_num_threads(1)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            for item in items[part::threads]:
                body(item)

    with _lock:
        try:
            torch.set_num_threads(1)
            futures = [_pool(threads).submit(share, part) for part in range(threads)]
            for future in futures:
                future.result()
        finally:
            torch.set_num_threads(threads)
