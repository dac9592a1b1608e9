"""A CenterPoint-style sparse middle encoder on cvops.sparse, forward and backward.

The network is the SECOND / CenterPoint ``SpMiddleResNetFHD``-like stack (without residuals): a subm
input layer, then four stages of (strided SparseConv3d, two SubMConv3d blocks) with BatchNorm1d + ReLU,
and a final z-downsampling SparseConv3d; the output is densified to the BEV map ``[B, C*D, H, W]``.
The input is LiDAR-like voxels on the design doc's grid (41, 1440, 1440) from the fixed-seed sweep
generator ``cvops.sparse.synthetic.lidar_voxels``: by default 20,000 voxels in a batch of 2 (a step takes
seconds on a small CPU), with ``--full`` the doc's network-scale case, 248,636 voxels in a batch of 4
(minutes and about 5 GB of memory on a 2-core CPU).

    python examples/sparse_encoder.py [--full] [--voxels N --batch B] [--device cpu|cuda] [--threads N]
"""
from __future__ import annotations

import argparse
import resource
import time

import torch
from torch import nn

import cvops
from cvops.sparse.synthetic import lidar_voxels

DOC_VOXELS, DOC_BATCH, DOC_GRID = 248636, 4, (41, 1440, 1440)
SMALL_VOXELS, SMALL_BATCH = 20000, 2  # the default: every layer of the doc case at a size a small CPU runs in seconds


def build_encoder(lib, in_channels: int = 5, width: int = 16):
    """The encoder built from ``lib`` (``cvops.sparse`` or ``spconv.pytorch``: same class names)."""

    def block(cin, cout, key):
        return lib.SparseSequential(lib.SubMConv3d(cin, cout, 3, padding=1, bias=False, indice_key=key),
                                    nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU())

    def down(cin, cout, kernel, stride, padding, key):
        return lib.SparseSequential(lib.SparseConv3d(cin, cout, kernel, stride, padding, bias=False, indice_key=key),
                                    nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU())

    w = width
    return lib.SparseSequential(
        block(in_channels, w, "res0"), block(w, w, "res0"), block(w, w, "res0"),
        down(w, 2 * w, 3, 2, 1, "down1"), block(2 * w, 2 * w, "res1"), block(2 * w, 2 * w, "res1"),
        down(2 * w, 4 * w, 3, 2, 1, "down2"), block(4 * w, 4 * w, "res2"), block(4 * w, 4 * w, "res2"),
        down(4 * w, 8 * w, 3, 2, (0, 1, 1), "down3"), block(8 * w, 8 * w, "res3"), block(8 * w, 8 * w, "res3"),
        down(8 * w, 8 * w, (3, 1, 1), (2, 1, 1), 0, "down4"),
    )


def make_input(num=DOC_VOXELS, batch=DOC_BATCH, grid=DOC_GRID, channels=5, seed=0):
    indices = lidar_voxels(num, batch, grid, seed=seed)
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(num, channels, generator=g)
    return features, indices


def bev(out) -> torch.Tensor:
    """``[B, C, D, H, W]`` -> ``[B, C*D, H, W]``, the map a 2-D detection head reads."""
    dense = out.dense()
    b, c, d, h, w = dense.shape
    return dense.reshape(b, c * d, h, w)


def run(device: torch.device, num: int, batch: int, repeats: int = 2) -> None:
    features, indices = make_input(num, batch)
    net = build_encoder(cvops.sparse).to(device).train()
    features, indices = features.to(device), indices.to(device)

    def step():
        x = cvops.sparse.SparseConvTensor(features.requires_grad_(), indices, list(DOC_GRID), batch)
        out = net(x)
        loss = bev(out).square().mean()
        loss.backward()
        return out, loss

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step()  # warm-up (Triton compiles on first use)
    times = []
    for _ in range(repeats):
        net.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out, loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    if device.type == "cuda":
        peak = f"{torch.cuda.max_memory_allocated(device) / 2**20:.0f} MiB GPU (max allocated)"
    else:
        peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB host (process max RSS)"
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    print(f"{device.type}{threads}: {num} voxels, batch {batch}, grid {DOC_GRID} -> out {tuple(out.features.shape)} "
          f"on {out.spatial_shape}, BEV {tuple(bev(out).shape)}")
    print(f"  forward+backward: {min(times) * 1e3:.0f} ms (best of {repeats}), loss {loss.item():.4f}, peak {peak}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help=f"the design doc's case: {DOC_VOXELS} voxels, "
                        f"batch {DOC_BATCH} (default: {SMALL_VOXELS}, batch {SMALL_BATCH})")
    parser.add_argument("--voxels", type=int, default=None, help="number of voxels (overrides --full's)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (overrides --full's)")
    parser.add_argument("--device", choices=["cpu", "cuda"], action="append")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = args.device or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    voxels = args.voxels or (DOC_VOXELS if args.full else SMALL_VOXELS)
    batch = args.batch or (DOC_BATCH if args.full else SMALL_BATCH)
    for name in devices:
        run(torch.device(name), voxels, batch, args.repeats)


if __name__ == "__main__":
    main()
