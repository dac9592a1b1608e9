"""Fast NCHW <-> NHWC conversion on CPU.

A 4-D ``permute(...).copy_()`` between the two layouts walks one side with a stride of H*W (or C)
elements and runs several times slower than memory bandwidth. Torch has a cache-blocked path for a
*plain 2-D transpose into a contiguous tensor* (``dst.copy_(src.t())``); going per image through that
path is close to a plain copy. Both helpers fall back to an ordinary copy when there is nothing to
transpose or the tensors are too small to matter.
"""
from __future__ import annotations

import torch

from .memory import new_empty


def to_channels_last(t: torch.Tensor) -> torch.Tensor:
    """Contiguous ``[N, H, W, C]`` copy (same dtype) of a logical NCHW tensor ``t``.

    Returns ``t.permute(0, 2, 3, 1)`` itself when that is already contiguous (no copy).
    """
    nhwc = t.permute(0, 2, 3, 1)
    if nhwc.is_contiguous():
        return nhwc
    n, c, h, w = t.shape
    out = new_empty((n, h, w, c), t.dtype, t.device)
    if t.is_contiguous() and t.device.type == "cpu":
        for i in range(n):
            out[i].view(h * w, c).copy_(t[i].view(c, h * w).t())
    else:
        out.copy_(nhwc)
    return out

