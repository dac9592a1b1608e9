"""psamask reference: the loops of psamask.md §3.1.1 (COLLECT) and §3.1.2 (DISTRIBUTE), on flat NHWC
buffers, with the doc's missing operators restored (semantics.md §1). The innermost ``widx`` loop is a
strided slice (the output index moves by 1 for COLLECT and by ``c_o`` for DISTRIBUTE). Values are
copied as raw bits, so the result is exact for every dtype and NaN payload.

Backward is the adjoint over the same loops: ``dx[mask_index] = dy[out_index]``, dx zero elsewhere.
"""
from __future__ import annotations

import numpy as np
import torch

from ..._core.bits import as_bits
from .checks import COLLECT


def _flat_bits(t: torch.Tensor) -> np.ndarray:
    """NHWC-contiguous copy of a logical NCHW tensor as a flat integer array of the same width."""
    flat = t.permute(0, 2, 3, 1).contiguous().cpu().reshape(-1)
    return as_bits(flat).numpy()


def _from_bits(flat: np.ndarray, shape_nhwc, like: torch.Tensor) -> torch.Tensor:
    out = torch.from_numpy(flat).view(like.dtype).view(shape_nhwc)
    return out.permute(0, 3, 1, 2).to(like.device)


def _into(result: torch.Tensor, out) -> torch.Tensor:
    return result if out is None else out.copy_(result)


def _walk(num, h_feature, w_feature, h_mask, w_mask, psa_type):
    """Yield (input_slice, output_slice) pairs of the doc's loops, innermost loop as slices."""
    c_o = h_feature * w_feature
    h_o_offset, w_o_offset = w_feature * c_o, c_o
    c_i = h_mask * w_mask
    h_i_offset, w_i_offset = w_feature * c_i, c_i
    n_o_offset, n_i_offset = h_feature * w_feature * c_o, h_feature * w_feature * c_i
    half_h_mask, half_w_mask = (h_mask - 1) // 2, (w_mask - 1) // 2
    for n in range(num):
        for h in range(h_feature):
            for w in range(w_feature):
                h_start = max(0, half_h_mask - h)
                w_start = max(0, half_w_mask - w)
                h_end = min(h_mask, h_feature + half_h_mask - h)
                w_end = min(w_mask, w_feature + half_w_mask - w)
                if w_start >= w_end:
                    continue
                for hidx in range(h_start, h_end):
                    widx = w_start  # first element of the innermost loop
                    mask_index = n * n_i_offset + h * h_i_offset + w * w_i_offset + (hidx * w_mask + widx)
                    count = w_end - w_start
                    if psa_type == COLLECT:
                        out_index = (n * n_o_offset + h * h_o_offset + w * w_o_offset
                                     + (hidx + h - half_h_mask) * w_feature + (widx + w - half_w_mask))
                        out_step = 1
                    else:
                        out_index = (n * n_o_offset + (hidx + h - half_h_mask) * h_o_offset
                                     + (widx + w - half_w_mask) * w_o_offset + h * w_feature + w)
                        out_step = w_o_offset
                    yield (slice(mask_index, mask_index + count),
                           slice(out_index, out_index + out_step * (count - 1) + 1, out_step))


def forward(x: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str, out=None) -> torch.Tensor:
    """x: logical NCHW ``[N, h_mask*w_mask, H, W]`` -> logical NCHW ``[N, H*W, H, W]`` (written into ``out``
    when given)."""
    num, _, h_feature, w_feature = x.shape
    src = _flat_bits(x)
    out_bits = np.zeros(num * h_feature * w_feature * h_feature * w_feature, dtype=src.dtype)
    for in_slice, out_slice in _walk(num, h_feature, w_feature, h_mask, w_mask, psa_type):
        out_bits[out_slice] = src[in_slice]
    return _into(_from_bits(out_bits, (num, h_feature, w_feature, h_feature * w_feature), x), out)


def backward(dy: torch.Tensor, psa_type: int, h_mask: int, w_mask: int, layout: str, out=None) -> torch.Tensor:
    """dy: logical NCHW ``[N, H*W, H, W]`` -> dx logical NCHW ``[N, h_mask*w_mask, H, W]`` (written into
    ``out`` when given)."""
    num, _, h_feature, w_feature = dy.shape
    src = _flat_bits(dy)
    dx = np.zeros(num * h_feature * w_feature * h_mask * w_mask, dtype=src.dtype)
    for in_slice, out_slice in _walk(num, h_feature, w_feature, h_mask, w_mask, psa_type):
        dx[in_slice] = src[out_slice]
    return _into(_from_bits(dx, (num, h_feature, w_feature, h_mask * w_mask), dy), out)
