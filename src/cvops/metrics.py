"""The accuracy criteria of MLU-OPS's tests, for comparing a kernel's output ``a`` with a reference ``b``
(sums in float64 on the CPU): pure-IO ops must match exactly (``diff3 == 0`` or :func:`bit_equal`),
accumulating ops pass with ``diff1 <= 3e-3`` and ``diff2 <= 3e-3`` (MLU-OPS's static threshold).
"""
from __future__ import annotations

import torch

from ._core.bits import as_bits

__all__ = ["bit_equal", "diff1", "diff2", "diff3"]

_EPS = 1e-9


def _pair(actual: torch.Tensor, expected: torch.Tensor):
    if actual.shape != expected.shape:
        raise ValueError(f"shape mismatch: actual {tuple(actual.shape)} vs expected {tuple(expected.shape)}")
    return actual.detach().double().cpu().flatten(), expected.detach().double().cpu().flatten()


def diff1(actual, expected) -> float:
    """Mean relative error, ``sum|a - b| / (sum|b| + 1e-9)``: the average error, scaled by the average value."""
    e, b = _pair(actual, expected)
    return float((e - b).abs().sum() / (b.abs().sum() + _EPS))


def diff2(actual, expected) -> float:
    """Relative RMS error, ``sqrt(sum (a - b)^2 / (sum b^2 + 1e-9))``: weighs the large errors more than diff1."""
    e, b = _pair(actual, expected)
    return float(torch.sqrt(((e - b) ** 2).sum() / ((b**2).sum() + _EPS)))


def diff3(actual, expected, eps: float | None = None) -> float:
    """The worst single point: max over points of ``|a - b|`` where ``|b| < eps``, else ``|a - b| / (|b| + 1e-9)``.

    ``eps`` defaults to 1e-4 for half types and 1e-6 otherwise. NaN matching NaN and equal
    infinities count as no error; any other NaN or inf mismatch is ``inf``.
    """
    if eps is None:
        eps = 1e-4 if actual.dtype in (torch.float16, torch.bfloat16) else 1e-6
    e, b = _pair(actual, expected)
    same = (e == b) | (torch.isnan(e) & torch.isnan(b))
    err = torch.where(b.abs() < eps, (e - b).abs(), (e - b).abs() / (b.abs() + _EPS))
    err = torch.where(same, torch.zeros_like(err), torch.nan_to_num(err, nan=float("inf")))
    return float(err.max()) if err.numel() else 0.0


def bit_equal(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaN payloads included): the pure-IO contract."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    a, b = actual.detach().cpu().contiguous(), expected.detach().cpu().contiguous()
    return bool(torch.equal(as_bits(a), as_bits(b)))
