"""Output allocation for the CPU backends.

A fresh torch CPU tensor is backed by 4 KiB pages, and first touch of a 90 MB output costs ~25 ms
of page faults on the 2-core CI machine, more than the kernel itself. NumPy asks the kernel for
transparent huge pages on large buffers, so outputs allocated through it are several times
cheaper to fill. ``benchmarks/`` measures the difference.
"""
from __future__ import annotations

import numpy as np
import torch

_NUMPY_OF = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
             torch.bfloat16: np.int16, torch.int16: np.int16, torch.int32: np.int32,
             torch.int64: np.int64, torch.uint8: np.uint8, torch.int8: np.int8, torch.bool: np.bool_}
_HUGE = 1 << 21  # below this the page-fault cost does not matter


def new_empty(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.empty`` that uses huge-page-friendly memory for large CPU tensors."""
    device = torch.device(device)
    numel = 1
    for s in shape:
        numel *= int(s)
    if device.type != "cpu" or dtype not in _NUMPY_OF or numel * torch.empty((), dtype=dtype).element_size() < _HUGE:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    t = torch.from_numpy(np.empty(tuple(int(s) for s in shape), dtype=_NUMPY_OF[dtype]))
    return t.view(dtype) if dtype == torch.bfloat16 else t


def new_zeros(shape, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    return new_empty(shape, dtype, device).zero_()
