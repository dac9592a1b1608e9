"""Data-parallel training of a small model built on cvops ops, with torch's DistributedDataParallel.

The model upsamples a stem feature with CARAFE (``CARAFEPack``), mixes it with PSANet-style point-wise
attention (``PSAMask``, collect mode) and predicts a map with a ``MaskedConv2d`` head evaluated only at
each image's mask points (RetinaNet's masked conv, one image at a time as mmcv requires). Every op has a
deterministic backward, so the ranks' gradients, all-reduced by DDP, leave identical parameters: at the
end the ranks compare their parameters bit for bit and rank 0 prints whether they are equal.

    python examples/ddp_train.py                       # 2 CPU processes, gloo, 20 steps on 8x8 images
    python examples/ddp_train.py --full                # 200 steps on 32x32 images
    python examples/ddp_train.py --world-size 4 --steps 50
    python examples/ddp_train.py --save-dir out/       # each rank writes out/rank<r>.pt at the end

On a machine with at least ``world-size`` CUDA GPUs it uses NCCL and one GPU per process (Triton kernels);
otherwise gloo on the CPU.
"""
from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import cvops


class TinyPSANet(nn.Module):
    """stem conv -> CARAFE x2 -> + PSA context -> masked 3x3 head."""

    def __init__(self, channels: int = 8, mask_size: int = 5):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.up = cvops.nn.CARAFEPack(channels, 2, up_kernel=3, compressed_channels=8)
        self.attention = nn.Conv2d(channels, mask_size * mask_size, 1)
        self.psa = cvops.nn.PSAMask("collect", (mask_size, mask_size))
        self.head = cvops.nn.MaskedConv2d(channels, 1, 3, padding=1)

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.up(torch.relu(self.stem(image)))
        n, c, h, w = x.shape
        # collect: attention[n, q, p] weights the feature at q for the output at p (zero outside the window)
        attention = self.psa(self.attention(x)).view(n, h * w, h * w)
        context = torch.bmm(x.view(n, c, h * w), attention).view(n, c, h, w)
        features = x + context / (h * w)
        return torch.cat([self.head(features[i:i + 1], mask[i:i + 1]) for i in range(n)])


def batch(rank: int, step: int, size: int, device: torch.device):
    """Each rank draws its own images (what a DistributedSampler would hand it)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    image = torch.randn(2, 3, size, size, generator=g)
    mask = (torch.rand(2, 2 * size, 2 * size, generator=g) > 0.7).float()
    target = torch.randn(2, 1, 2 * size, 2 * size, generator=g) * mask[:, None]
    return image.to(device), mask.to(device), target.to(device)


def train(rank: int, world_size: int, steps: int, port: int, save_dir: str | None, size: int) -> None:
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world_size
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)
    if use_cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # one core per process
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(TinyPSANet().to(device), device_ids=[rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        image, mask, target = batch(rank, step, size, device)
        loss = torch.nn.functional.mse_loss(model(image, mask), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients across ranks here
        optimizer.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f} (rank 0's batch)", flush=True)
    equal, values = parameters_equal_across_ranks(model.module, world_size)
    if rank == 0:
        print(f"ranks ended with equal parameters: {'yes' if equal else 'NO'} ({values:,} values compared bit "
              f"for bit across {world_size} ranks)", flush=True)
    if save_dir:
        torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, Path(save_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def parameters_equal_across_ranks(model: nn.Module, world_size: int) -> tuple[bool, int]:
    """Whether every rank holds the same bits in every parameter (all-gathered as raw int32 words), and how
    many values were compared."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).float()
    bits = flat.view(torch.int32)  # bit equality: -0.0 and 0.0 differ, a NaN equals its own bits
    gathered = [torch.empty_like(bits) for _ in range(world_size)]
    dist.all_gather(gathered, bits)
    return all(torch.equal(gathered[0], other) for other in gathered[1:]), bits.numel()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="200 steps on 32x32 images (default: 20 steps, 8x8)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (overrides --full's)")
    parser.add_argument("--size", type=int, default=None,
                        help="input height and width, the model works at twice it (overrides --full's)")
    parser.add_argument("--save-dir", default=None, help="write each rank's final state_dict here")
    args = parser.parse_args(argv)
    if args.save_dir:
        Path(args.save_dir).mkdir(parents=True, exist_ok=True)
    steps = args.steps or (200 if args.full else 20)
    size = args.size or (32 if args.full else 8)
    start = time.perf_counter()
    mp.spawn(train, args=(args.world_size, steps, free_port(), args.save_dir, size), nprocs=args.world_size, join=True)
    print(f"{steps} steps on {args.world_size} ranks took {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
