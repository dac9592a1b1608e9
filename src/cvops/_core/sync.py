"""Data-dependent value checks without a host synchronisation on CUDA.

On the CPU a check such as "every RoI's batch index lies in [0, N)" runs eagerly and names the offending
entry. On CUDA, reading values back would stall the host and break CUDA graph capture, so the condition is
queued on the device and a violation raises a device-side assertion at the next synchronisation. torch has
no public asynchronous assertion, so a failing condition selects an out-of-range index for a one-element
``index_select``; the message is lost on CUDA (torch issue 131491) and only documents the call site.
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
    boolean tensor ``on_device()`` (``message``: what it asserts) as a device-side assertion."""
    if host_checks(t):
        on_host()
        return
    ok = on_device()
    index = torch.logical_not(ok).to(torch.int64).reshape(1)  # 0 when the condition holds, else 1
    torch.zeros(1, dtype=torch.int8, device=ok.device).index_select(0, index)
