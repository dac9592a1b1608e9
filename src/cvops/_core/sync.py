"""Data-dependent value checks without a host synchronisation on CUDA.

A check such as "every RoI's batch index lies in [0, N)" reads tensor values. On the CPU it runs eagerly
and raises :class:`~cvops.BadParamError` naming the offending entry. On a CUDA tensor reading the values
back would stall the host until the GPU catches up, and it breaks CUDA graph capture and
``torch.compile(mode="reduce-overhead")``; there the same condition is queued with ``torch._assert_async``,
so a violation raises a device-side assertion at the next synchronisation instead (no wrong result is
ever returned).
"""
from __future__ import annotations

from typing import Callable

import torch


def host_checks(t: torch.Tensor) -> bool:
    """Whether value checks on ``t`` may read it on the host (everything but CUDA tensors)."""
    return t.device.type != "cuda"


def check_values(t: torch.Tensor, on_host: Callable[[], None], on_device: Callable[[], torch.Tensor],
                 message: str) -> None:
    """Runs ``on_host()`` (raises with details) where the host may read ``t``; otherwise queues the
    boolean tensor ``on_device()`` as an asynchronous assertion with ``message``."""
    if host_checks(t):
        on_host()
    else:
        torch._assert_async(on_device(), message)
