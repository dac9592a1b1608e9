"""Benchmark harness shared by ``benchmarks/bench_<op>.py``, ``run_all.py`` and ``make demo``.

MLU-OPS definitions (semantics.md §0): theory IO = all input bytes + all output bytes;
io_efficiency = theory_io / (time * bandwidth); compute_efficiency = theory_ops / (time * peak).
The bandwidth and peak are *measured in the same run* (a large copy, a large fp32 matmul), so the
ratios describe this machine, whatever it is.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

# Benchmarks time the compiled kernels (the default; CVOPS_NUMBA=0 in the environment times the torch path).
os.environ.setdefault("CVOPS_NUMBA", "1")

# The bench files read their cases and input generators from the checkout's tests/support package.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


QUICK = {"enabled": False, "min_s": 0.3, "max_s": 2.0, "slow_s": 0.5}


def set_quick(enabled: bool, min_s: float = 0.3, max_s: float = 2.0, slow_s: float = 0.5) -> None:
    """Quick timing (``make demo``): after one warm-up call, :func:`time_fn` and :func:`time_pair` sample until
    they hold at least 3 samples and ``min_s`` seconds of them (fast calls: hundreds of samples, a stable
    median), or ``max_s`` seconds (slow calls: one or two samples); a warm-up call slower than ``slow_s``
    seconds is the measurement itself. The case's own repeat counts and minimum times do not apply."""
    QUICK.update(enabled=enabled, min_s=min_s, max_s=max_s, slow_s=slow_s)


def _enough(samples: int, total: float, repeats: int, min_total_s: float) -> bool:
    """Whether a timing loop holding ``samples`` samples summing to ``total`` seconds may stop."""
    if QUICK["enabled"]:
        return (samples >= 3 and total >= QUICK["min_s"]) or (samples >= 1 and total >= QUICK["max_s"])
    return (samples >= repeats and total >= min_total_s) or samples >= 10 * repeats


def _sample(fn: Callable[[], object], device: torch.device) -> float:
    """One timed call of ``fn`` in seconds (CUDA events on GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def time_fn(fn: Callable[[], object], device: torch.device, *, repeats: int = 7, warmup: int = 1,
            min_total_s: float = 0.0) -> float:
    """Median wall time of ``fn()`` in seconds (CUDA events on GPU); see :func:`set_quick` for quick mode."""
    if QUICK["enabled"]:
        warmup = min(warmup, 1)
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        if QUICK["enabled"] and time.perf_counter() - t0 > QUICK["slow_s"]:
            return time.perf_counter() - t0  # a call this slow is its own steady state (anchors at full scale)
    synchronize(device)
    times: list[float] = []
    total = 0.0
    while not _enough(len(times), total, repeats, min_total_s):
        times.append(_sample(fn, device))
        total += times[-1]
    return statistics.median(times)


def time_pair(fn: Callable[[], object], anchor: Callable[[], object], device: torch.device, *,
              repeats: int = 9, min_total_s: float = 0.0) -> tuple[float, float]:
    """Median wall times of ``fn()`` and ``anchor()``, sampled alternately, so that a slow spell of a shared
    machine falls on both and their ratio holds (two separate :func:`time_fn` runs of sub-millisecond calls
    can land in different spells)."""
    fn(), anchor()
    synchronize(device)
    ours: list[float] = []
    theirs: list[float] = []
    total = 0.0
    while not _enough(len(ours), total, repeats, min_total_s):
        ours.append(_sample(fn, device))
        theirs.append(_sample(anchor, device))
        total += ours[-1] + theirs[-1]
    return statistics.median(ours), statistics.median(theirs)


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


@contextlib.contextmanager
def counting_gemm_flops(net: torch.nn.Module, total: list):
    """Appends to ``total`` the forward matrix-product FLOPs (``2 * pairs * C_in * C_out``) of each cvops sparse
    convolution of ``net`` each time it runs inside the block, read off the kernel map its output carries
    (NaN for a layer whose map is cached under no ``indice_key``)."""
    from cvops.sparse import SparseConvolution

    def hook(module, inputs, output):
        data = output.indice_dict.get(module.indice_key)
        total.append(2.0 * float(data.indice_num.sum()) * module.in_channels * module.out_channels
                     if data is not None else float("nan"))

    handles = [m.register_forward_hook(hook) for m in net.modules() if isinstance(m, SparseConvolution)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def matmul_rate(device: torch.device) -> float:
    """fp32 matmul FLOP/s at torch's current thread count (2048-square on the CPU, 8192 on a GPU, best of 5)."""
    m = 2048 if device.type == "cpu" else 8192
    a = torch.rand(m, m, device=device)
    b = torch.rand(m, m, device=device)
    return 2 * m**3 / time_fn(lambda: a @ b, device, repeats=5, warmup=1)


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
        return cls(device, bandwidth, matmul_rate(device))

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


def demo_console():
    """A rich console at most 100 columns wide (100 when the output is not a terminal)."""
    from rich.console import Console
    console = Console()
    return Console(width=min(console.width, 100) if console.is_terminal else 100)


def module_version(name: str) -> str:
    """``name.__version__`` of an installed anchor such as spconv, or ``""`` where it does not import."""
    try:
        return importlib.import_module(name).__version__
    except Exception:  # absent, or an anchor build that fails to load here
        return ""


def load_module(path, name: str = ""):
    """Imports the Python file at ``path`` (a benchmark, an example) as a module named ``name`` (its stem)."""
    import importlib.util
    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
