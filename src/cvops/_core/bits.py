"""Raw bits of tensors. Pure-IO kernels move values as same-width integers, so every float (NaN
payloads, -0.0, float16/bfloat16 included) arrives bit for bit, and a copy loop needs one kernel per
width rather than per dtype."""
from __future__ import annotations

import numpy as np
import torch

INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_OF = {torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32,
             torch.int64: np.int64, torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
             torch.bool: np.bool_}


class _Interface:
    """Carries an ``__array_interface__`` (NumPy's protocol for foreign memory) and the tensor that owns
    the memory; the array keeps this object as its ``base``, so the tensor lives as long as the array."""

    __slots__ = ("__array_interface__", "owner")


def numpy_alias(t: torch.Tensor) -> np.ndarray:
    """An ndarray over ``t``'s memory (same shape and strides) for the numba kernels, keeping ``t`` alive;
    unlike ``Tensor.numpy()`` it leaves the storage resizable. bfloat16 goes through :func:`as_bits` first.
    """
    holder = _Interface()
    holder.owner = t
    holder.__array_interface__ = {
        "version": 3, "shape": tuple(t.shape), "typestr": np.dtype(_NUMPY_OF[t.dtype]).str,
        "data": (t.data_ptr() if t.numel() else 0, False),
        "strides": tuple(s * t.element_size() for s in t.stride()) if t.numel() else None}
    return np.asarray(holder)


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as the integer dtype of its width (integer tensors are returned as they are)."""
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        return t.view(INT_OF_WIDTH[t.element_size()])
    return t


def storage_bits(t: torch.Tensor) -> np.ndarray:
    """The whole storage of a CPU tensor as a flat integer array; ``t``'s element 0 sits at index
    ``t.storage_offset()``, and element ``i`` of ``t`` at ``storage_offset + sum(i_d * stride_d)``."""
    bits = as_bits(t.detach())
    storage_len = t.untyped_storage().nbytes() // t.element_size()
    return numpy_alias(torch.as_strided(bits, (storage_len,), (1,), 0))
