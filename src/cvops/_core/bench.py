"""Benchmark harness shared by ``benchmarks/bench_<op>.py`` and ``make demo``.

MLU-OPS definitions (semantics.md §0): theory IO = all input bytes + all output bytes;
io_efficiency = theory_io / (time * bandwidth); compute_efficiency = theory_ops / (time * peak).
The bandwidth and peak are *measured in the same run* (a large copy, a large fp32 matmul), so the
ratios describe this machine, whatever it is.
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], device: torch.device, *, repeats: int = 7, warmup: int = 1,
            min_total_s: float = 0.0) -> float:
    """Median wall time of ``fn()`` in seconds (CUDA events on GPU)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    while len(times) < repeats or sum(times) < min_total_s:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if len(times) >= 10 * repeats:
            break
    return statistics.median(times)


def tensor_bytes(*tensors) -> int:
    """Sum of ``numel * element_size`` over tensors (nested sequences and None allowed)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        if isinstance(t, (list, tuple)):
            total += tensor_bytes(*t)
        else:
            total += t.numel() * t.element_size()
    return total


@dataclass
class MachineLimits:
    """Measured copy bandwidth (bytes read + written per second) and fp32 matmul FLOP/s."""

    device: torch.device
    bandwidth: float
    matmul_flops: float
    threads: int = field(default_factory=torch.get_num_threads)

    @classmethod
    def measure(cls, device: torch.device | str = "cpu", copy_mib: int = 256) -> "MachineLimits":
        device = torch.device(device)
        n = copy_mib * 2**20 // 4
        src = torch.rand(n, device=device)
        dst = torch.empty_like(src)
        t_copy = time_fn(lambda: dst.copy_(src), device, repeats=9, warmup=2)
        bandwidth = 2 * src.numel() * 4 / t_copy
        m = 2048 if device.type == "cpu" else 8192
        a = torch.rand(m, m, device=device)
        b = torch.rand(m, m, device=device)
        t_mm = time_fn(lambda: a @ b, device, repeats=5, warmup=1)
        return cls(device, bandwidth, 2 * m**3 / t_mm)

    def describe(self) -> str:
        where = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else \
            f"CPU, {self.threads} threads"
        return (f"{where}: copy bandwidth {self.bandwidth / 1e9:.1f} GB/s (read+write), "
                f"fp32 matmul {self.matmul_flops / 1e9:.0f} GFLOP/s")


@dataclass
class BenchRow:
    op: str
    case: str
    direction: str
    backend: str
    seconds: float
    io_bytes: int
    flops: float = 0.0
    check: str = ""            # "exact", "diff1=..." or "" when not compared
    anchor: str = ""           # name of the anchor timed in the same run
    anchor_seconds: float | None = None

    def io_efficiency(self, limits: MachineLimits) -> float:
        return self.io_bytes / (self.seconds * limits.bandwidth)

    def compute_efficiency(self, limits: MachineLimits) -> float:
        return self.flops / (self.seconds * limits.matmul_flops) if self.flops else 0.0

    def roofline_efficiency(self, limits: MachineLimits) -> float:
        """Time bound max(IO / bandwidth, FLOPs / matmul rate) over the measured time."""
        bound = max(self.io_bytes / limits.bandwidth, self.flops / limits.matmul_flops)
        return bound / self.seconds

    def as_dict(self, limits: MachineLimits) -> dict:
        return {"op": self.op, "case": self.case, "direction": self.direction, "backend": self.backend,
                "seconds": self.seconds, "io_bytes": self.io_bytes, "flops": self.flops,
                "io_efficiency": self.io_efficiency(limits),
                "compute_efficiency": self.compute_efficiency(limits),
                "roofline_efficiency": self.roofline_efficiency(limits), "check": self.check,
                "anchor": self.anchor, "anchor_seconds": self.anchor_seconds}


def print_table(rows: Sequence[BenchRow], limits: MachineLimits, title: str) -> None:
    """Print rows with time, IO, IO/compute/roofline efficiency and the anchor ratio."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # rich is the bench extra; plain text keeps the harness dependency-free
        Console = Table = None
    headers = ["op", "case", "dir", "backend", "check", "time ms", "IO MB", "IO eff", "compute eff",
               "roofline", "anchor", "vs anchor"]
    body = []
    for r in rows:
        ratio = f"{r.anchor_seconds / r.seconds:.2f}x" if r.anchor_seconds else ""
        body.append([r.op, r.case, r.direction, r.backend, r.check, f"{r.seconds * 1e3:.2f}",
                     f"{r.io_bytes / 1e6:.1f}", f"{r.io_efficiency(limits):.0%}",
                     f"{r.compute_efficiency(limits):.1%}" if r.flops else "-",
                     f"{r.roofline_efficiency(limits):.0%}", r.anchor, ratio])
    caption = limits.describe() + ". 'vs anchor' = anchor time / cvops time (>1: cvops faster)."
    if Table is None:
        print(title)
        print(" | ".join(headers))
        for line in body:
            print(" | ".join(line))
        print(caption)
        return
    table = Table(title=title, caption=caption)
    for h in headers:
        table.add_column(h, justify="right" if h not in ("op", "case", "dir", "backend", "check", "anchor") else "left")
    for line in body:
        table.add_row(*line)
    Console(width=200).print(table)


# Command-line options a benchmark may add to the common ones; each lands in run() as the keyword `dest`.
BACKEND = ("--backend", {"dest": "backend", "default": None, "help": "reference, cpu or triton (default: by device)"})
NO_CHECK = ("--no-check", {"dest": "check", "action": "store_false", "help": "skip the comparison with the reference"})
NO_ANCHOR = ("--no-anchor", {"dest": "anchor", "action": "store_false", "help": "skip timing the anchor"})


def bench_main(run: Callable[..., list], title: str, doc: str | None = None, options=(BACKEND,)) -> None:
    """The command line of every ``benchmarks/bench_<op>.py``: ``--tag``, ``--device``, ``--threads`` and
    the op's ``options``; measures the machine, calls ``run(limits, tag=..., **options)``, prints the table."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--tag", default="network", help="cases of cases/<op>.json with this tag")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    for flag, kwargs in options:
        parser.add_argument(flag, **kwargs)
    args = vars(parser.parse_args())
    tag, device, threads = args.pop("tag"), args.pop("device"), args.pop("threads")
    if threads:
        torch.set_num_threads(threads)
    limits = MachineLimits.measure(device)
    print_table(run(limits, tag=tag, **args), limits, f"{title} ({tag} cases)")
