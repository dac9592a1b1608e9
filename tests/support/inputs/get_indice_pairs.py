"""The voxel sets of ``cases/get_indice_pairs.json``: explicit rows, or the generators of
:mod:`cvops.sparse.synthetic` (``lidar``, ``uniform``) with the case's size and seed."""
from __future__ import annotations

import torch

from cvops.sparse.synthetic import lidar_voxels, uniform_voxels

__all__ = ["case_indices", "case_kwargs", "lidar_voxels", "uniform_voxels"]


def case_indices(case: dict) -> torch.Tensor:
    """The ``indices`` of a case of ``cases/get_indice_pairs.json``: explicit rows or a generator."""
    if "indices" in case:
        return torch.tensor(case["indices"], dtype=torch.int32).reshape(-1, len(case["spatial_shape"]) + 1)
    if case["generator"] == "lidar":
        idx = lidar_voxels(case["num"], case["batch_size"], case["spatial_shape"], case.get("seed", 0),
                           case.get("downsample", 0))
    else:
        idx = uniform_voxels(case["num"], case["batch_size"], case["spatial_shape"], case.get("seed", 0))
    if case.get("duplicates"):  # repeat some rows (legal for a regular conv)
        idx = torch.cat([idx, idx[: case["duplicates"]]])
    return idx


def case_kwargs(case: dict) -> dict:
    """Keyword arguments of :func:`cvops.get_indice_pairs` for a case."""
    keys = ("kernel_size", "stride", "padding", "dilation", "out_padding", "subm", "transpose", "out_spatial_shape")
    kwargs = {k: case[k] for k in keys if k in case}
    return dict(batch_size=case["batch_size"], spatial_shape=case["spatial_shape"], **kwargs)
