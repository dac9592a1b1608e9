"""Raw bits of tensors. Pure-IO kernels move values as same-width integers, so every float (NaN
payloads, -0.0, float16/bfloat16 included) arrives bit for bit, and a copy loop needs one kernel per
width rather than per dtype."""
from __future__ import annotations

import numpy as np
import torch

INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


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
    return torch.as_strided(bits, (storage_len,), (1,), 0).numpy()
