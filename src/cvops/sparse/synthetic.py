"""Synthetic voxel sets (fixed seed, reproducible on any machine) for examples, tests and benchmarks:
exactly ``num`` distinct rows ``(b, *coords)`` split evenly over the batch, in shuffled order (a voxeliser
emits sites in point order). LiDAR-like sets put most returns on a gently curved ground whose density falls
with range (beam rings) and the rest on the faces of boxes standing on it.
"""
from __future__ import annotations

import numpy as np
import torch


def _linear(coords: np.ndarray, shape) -> np.ndarray:
    return np.ravel_multi_index(tuple(coords.T), shape).astype(np.int64)


def _unravel(keys: np.ndarray, shape) -> np.ndarray:
    return np.stack(np.unravel_index(keys, shape), 1).astype(np.int64)


def _lidar_sample(rng: np.random.Generator, n: int, shape) -> np.ndarray:
    """About ``n`` candidate coordinates (z, y, x) of one sweep, duplicates allowed."""
    nz, ny, nx = shape
    cy, cx = ny / 2.0, nx / 2.0
    rmax = 0.5 * min(ny, nx)
    # ground: range distributed like a spinning LiDAR (dense near the sensor), ring-quantised
    n_ground = int(n * 0.7)
    rings = 64
    ring = rng.integers(0, rings, n_ground)
    r = 2.0 + (rmax - 2.0) * (ring / rings) ** 1.6 + rng.normal(0, 0.15, n_ground)
    theta = rng.uniform(0, 2 * np.pi, n_ground)
    y, x = cy + r * np.sin(theta), cx + r * np.cos(theta)
    tilt = rng.uniform(-1, 1, 2) * 0.1 * nz / max(ny, nx)
    ground = 0.25 * nz + tilt[0] * (y - cy) + tilt[1] * (x - cx) + 0.05 * nz * np.sin(x / 97.0) * np.cos(y / 71.0)
    z = ground + rng.normal(0, 0.3, n_ground)
    pts = [np.stack([z, y, x], 1)]
    # objects: boxes (cars, pedestrians, poles) standing on the ground, visible faces only
    n_obj_pts = n - n_ground
    n_boxes = max(4, n_obj_pts // 400)
    owner = rng.integers(0, n_boxes, n_obj_pts)
    br = rng.uniform(0.1, 0.9, n_boxes) * rmax
    bt = rng.uniform(0, 2 * np.pi, n_boxes)
    by, bx = cy + br * np.sin(bt), cx + br * np.cos(bt)
    scale = max(ny, nx) / 1440.0
    size_y = rng.uniform(4, 20, n_boxes) * scale + 1
    size_x = rng.uniform(4, 40, n_boxes) * scale + 1
    height = rng.uniform(0.2, 0.45, n_boxes) * nz
    face = rng.integers(0, 3, n_obj_pts)  # 0: y face, 1: x face, 2: roof
    u, v = rng.random(n_obj_pts), rng.random(n_obj_pts)
    oy = by[owner] + np.where(face == 0, -0.5, u - 0.5) * size_y[owner]
    ox = bx[owner] + np.where(face == 1, -0.5, v - 0.5) * size_x[owner]
    base = 0.25 * nz
    oz = base + np.where(face == 2, 1.0, np.where(face == 0, v, u)) * height[owner]
    pts.append(np.stack([oz, oy, ox], 1))
    coords = np.floor(np.concatenate(pts)).astype(np.int64)
    upper = np.array(shape, dtype=np.int64) - 1
    return np.clip(coords, 0, upper)


def _distinct(rng, n: int, shape, draw) -> np.ndarray:
    """The first ``n`` distinct coordinates of a stream of ``draw(count)`` samples.

    Keeping the first arrivals (rather than a random subset of everything drawn) keeps the physical
    density: likely cells fill up completely, as a real sweep fills the near field.
    """
    stream = np.empty(0, dtype=np.int64)
    want = n
    for _ in range(64):
        stream = np.concatenate([stream, _linear(draw(int(want * 1.2) + 16), shape)])
        keys, first = np.unique(stream, return_index=True)
        if len(keys) >= n:
            return _unravel(stream[np.sort(first)[:n]], shape)
        want = 2 * (n - len(keys)) + want
    raise ValueError(f"cannot draw {n} distinct sites in a grid of shape {tuple(shape)}")


def _downsample(coords: np.ndarray, shape) -> tuple[np.ndarray, tuple]:
    """Active output sites of a k3 s2 p1 sparse conv (what a backbone's downsampling layer emits)."""
    out_shape = tuple((s - 1) // 2 + 1 for s in shape)
    cands = []
    for taps in np.ndindex(3, 3, 3):
        num = coords + 1 - np.array(taps)
        ok = np.all((num >= 0) & (num % 2 == 0) & (num // 2 < np.array(out_shape)), axis=1)
        cands.append(num[ok] // 2)
    keys = np.unique(_linear(np.concatenate(cands), out_shape))
    return _unravel(keys, out_shape), out_shape


def _lidar_downsampled(rng, n: int, shape, levels: int) -> np.ndarray:
    """``n`` sites of a LiDAR sweep voxelised ``2**levels`` times finer and downsampled ``levels`` times,
    cropped to the ``n`` sites nearest the sensor (a range limit)."""
    fine = tuple(s * 2**levels for s in shape)
    count = n
    for _ in range(16):
        coords, cur = _distinct(rng, count, fine, lambda c: _lidar_sample(rng, c, fine)), fine
        for _ in range(levels):
            coords, cur = _downsample(coords, cur)
        coords = np.minimum(coords, np.array(shape) - 1)
        coords = _unravel(np.unique(_linear(coords, shape)), shape)
        if len(coords) >= n:
            rng_ = np.hypot(coords[:, 1] - shape[1] / 2.0, coords[:, 2] - shape[2] / 2.0)
            return coords[np.argsort(rng_, kind="stable")[:n]]
        count = int(count * 1.5 * n / max(len(coords), 1)) + 16
    raise ValueError(f"cannot draw {n} downsampled sites in a grid of shape {tuple(shape)}")


def _voxels(num: int, batch_size: int, spatial_shape, seed: int, kind: str, levels: int = 0) -> torch.Tensor:
    shape = tuple(int(s) for s in spatial_shape)
    rng = np.random.default_rng(seed)
    per_batch = [num // batch_size + (1 if b < num % batch_size else 0) for b in range(batch_size)]
    parts = []
    for b, n in enumerate(per_batch):
        if kind == "lidar":
            if len(shape) != 3:
                raise ValueError("lidar_voxels draws 3-D (z, y, x) grids")
            if levels:
                coords = _lidar_downsampled(rng, n, shape, levels)
            else:
                coords = _distinct(rng, n, shape, lambda c: _lidar_sample(rng, c, shape))
        else:
            coords = _distinct(rng, n, shape,
                               lambda c: np.stack([rng.integers(0, s, c) for s in shape], 1))
        parts.append(np.concatenate([np.full((n, 1), b, dtype=np.int64), coords], 1))
    rows = np.concatenate(parts) if parts else np.zeros((0, len(shape) + 1), dtype=np.int64)
    rows = rows[rng.permutation(len(rows))]
    return torch.from_numpy(rows.astype(np.int32))


def lidar_voxels(num: int, batch_size: int, spatial_shape, seed: int = 0, downsample: int = 0) -> torch.Tensor:
    """``[num, 4]`` int32 distinct LiDAR-like voxels ``(b, z, y, x)``; ``downsample`` > 0 gives the sites
    of a deeper backbone layer (a ``2**downsample`` finer sweep passed through that many k3 s2 convs)."""
    return _voxels(num, batch_size, spatial_shape, seed, "lidar", downsample)


def uniform_voxels(num: int, batch_size: int, spatial_shape, seed: int = 0) -> torch.Tensor:
    """``[num, NDim + 1]`` int32 distinct voxels drawn uniformly over the grid."""
    return _voxels(num, batch_size, spatial_shape, seed, "uniform")
