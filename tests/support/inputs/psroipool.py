"""Tensors for the cases of ``cases/psroipool.json`` (shared by tests, the benchmark and the demo)."""
from __future__ import annotations

import torch


def case_rois(case: dict, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[R, 5]`` rois: the explicit ``rois`` rows, or ``random_rois`` = {num, seed, image_hw} drawn
    reproducibly in image coordinates (about 10% of each box may hang outside the image)."""
    if "rois" in case:
        return torch.tensor(case["rois"], dtype=torch.float64).reshape(-1, 5).to(dtype)
    spec = case["random_rois"]
    gen = torch.Generator().manual_seed(spec["seed"])
    r, (img_h, img_w) = spec["num"], spec["image_hw"]
    batch = torch.randint(0, case["input_shape"][0], (r,), generator=gen).double()
    x1 = (torch.rand(r, generator=gen, dtype=torch.float64) * 1.1 - 0.1) * img_w
    y1 = (torch.rand(r, generator=gen, dtype=torch.float64) * 1.1 - 0.1) * img_h
    bw = torch.rand(r, generator=gen, dtype=torch.float64) * 0.7 * img_w + 1
    bh = torch.rand(r, generator=gen, dtype=torch.float64) * 0.7 * img_h + 1
    return torch.stack((batch, x1, y1, x1 + bw, y1 + bh), 1).to(dtype)


def case_input(case: dict, dtype: torch.dtype = torch.float32, seed: int = 0, shape=None) -> torch.Tensor:
    """A random NHWC input of the case's ``input_shape`` (or ``shape``)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape or case["input_shape"]), generator=gen, dtype=torch.float64).to(dtype)
