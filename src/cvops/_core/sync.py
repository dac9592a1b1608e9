"""Data-dependent value checks without a host synchronisation on CUDA.

A check such as "every RoI's batch index lies in [0, N)" reads tensor values. On the CPU it runs eagerly
and raises :class:`~cvops.BadParamError` naming the offending entry. On a CUDA tensor reading the values
back would stall the host until the GPU catches up, and it breaks CUDA graph capture and
``torch.compile(mode="reduce-overhead")``; there the condition is queued on the device instead, so a
violation raises a device-side assertion at the next synchronisation (no wrong result is ever returned).

torch has no public asynchronous assertion (``torch._assert_async`` is private), so the condition selects
an index that is out of range exactly when it fails, and a one-element ``index_select`` trips the device's
own bounds assertion. On CUDA the message of either is lost: the error reads "device-side assert
triggered" (torch issue 131491), so ``message`` only documents the call site.
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
