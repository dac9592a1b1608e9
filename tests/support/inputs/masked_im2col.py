"""Build the tensors of a ``cases/masked_im2col.json`` case (shared by tests and the benchmark).

A case gives the feature shape, kernel, pad, dtypes and the mask points as one of: explicit
``mask_h_idx``/``mask_w_idx`` lists; ``mask_ratio`` (a random mask, points in ``nonzero`` order as
mmcv's MaskedConv2d produces them); or ``mask_cnt`` (distinct in-range points, sorted) with an
optional ``index_range`` ``[lo, hi)`` (then points are drawn independently, duplicates allowed).
"""
from __future__ import annotations

import torch

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64, "int32": torch.int32, "int64": torch.int64}


def case_inputs(case: dict, seed: int = 0, device="cpu"):
    """``(feature, mask_h_idx, mask_w_idx, kernel_size, padding)`` for ``case``."""
    gen = torch.Generator().manual_seed(seed)
    _, channels, height, width = case["feature"]
    feature = torch.randn(case["feature"], generator=gen).to(DTYPES[case["dtype"]])
    if "mask_h_idx" in case:
        mask_h_idx, mask_w_idx = torch.tensor(case["mask_h_idx"]), torch.tensor(case["mask_w_idx"])
    elif "mask_ratio" in case:
        mask = torch.rand(height, width, generator=gen) < case["mask_ratio"]
        mask_h_idx, mask_w_idx = torch.nonzero(mask, as_tuple=True)
    elif "index_range" in case:
        lo, hi = case["index_range"]
        mask_h_idx = torch.randint(lo, hi, (case["mask_cnt"],), generator=gen)
        mask_w_idx = torch.randint(lo, hi, (case["mask_cnt"],), generator=gen)
    else:
        flat = torch.randperm(height * width, generator=gen)[:case["mask_cnt"]].sort().values
        mask_h_idx, mask_w_idx = flat // width, flat % width
    index_dtype = DTYPES[case["index_dtype"]]
    return (feature.to(device), mask_h_idx.to(index_dtype).to(device), mask_w_idx.to(index_dtype).to(device),
            tuple(case["kernel"]), tuple(case["pad"]))


def case_mask(case: dict, mask_h_idx, mask_w_idx):
    """The ``[1, H, W]`` float mask whose ``nonzero`` points are the (in-range) mask points."""
    _, _, height, width = case["feature"]
    mask = torch.zeros(1, height, width, device=mask_h_idx.device)
    inside = (mask_h_idx >= 0) & (mask_h_idx < height) & (mask_w_idx >= 0) & (mask_w_idx < width)
    mask[0, mask_h_idx[inside].long(), mask_w_idx[inside].long()] = 1.0
    return mask
