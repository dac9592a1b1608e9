"""Index width for Triton kernels: they take an ``INDEX_64`` constexpr, ``False`` when :func:`needs_int64`
proves that every offset fits int32 (64-bit integer arithmetic is emulated on NVIDIA GPUs and doubles the
registers), ``True`` otherwise (a separate compiled variant, so large tensors stay correct).
"""
from __future__ import annotations

import contextlib

import torch

INT32_LIMIT = 2**31 - 1
_forced = False


def span(t: torch.Tensor) -> int:
    """One past the largest element offset of ``t`` (in elements; torch strides are never negative)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))


def needs_int64(*items) -> bool:
    """True if an offset into any tensor, or any int (a count or bound), may exceed int32 (with a factor 2
    of headroom for sums of two in-range offsets)."""
    if _forced:
        return True
    largest = 0
    for item in items:
        largest = max(largest, span(item) if isinstance(item, torch.Tensor) else abs(int(item)))
    return 2 * largest > INT32_LIMIT


@contextlib.contextmanager
def forced_int64():
    """Every kernel launched inside takes its int64 variant (tests run that variant on small tensors)."""
    global _forced
    previous, _forced = _forced, True
    try:
        yield
    finally:
        _forced = previous
