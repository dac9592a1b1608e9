"""Benchmark harness shared by ``benchmarks/bench_<op>.py``, ``run_all.py`` and ``make demo``.

MLU-OPS definitions (semantics.md §0): theory IO = all input bytes + all output bytes;
io_efficiency = theory_io / (time * bandwidth); compute_efficiency = theory_ops / (time * peak).
The bandwidth and peak are *measured in the same run* (a large copy, a large fp32 matmul), so the
ratios describe this machine, whatever it is.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

# Benchmarks time the compiled kernels: calls compile what they need on the calling thread instead of
# running the torch path until a background worker is done (CVOPS_NUMBA=0 still times the torch path).
os.environ.setdefault("CVOPS_NUMBA", "1")

# The bench files read their cases and input generators from the checkout's tests/support package.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


QUICK = {"enabled": False, "repeats": 3, "slow_s": 0.5}


def set_quick(enabled: bool, repeats: int = 3, slow_s: float = 0.5) -> None:
    """Quick timing (``make demo``): every :func:`time_fn` takes at most ``repeats`` samples after one
    warm-up call and no minimum total time, and a warm-up call slower than ``slow_s`` seconds is the
    measurement itself. Medians of 3 move more from run to run than the full ones."""
    QUICK.update(enabled=enabled, repeats=repeats, slow_s=slow_s)


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
    """Median wall time of ``fn()`` in seconds (CUDA events on GPU); fewer samples in quick mode."""
    if QUICK["enabled"]:
        repeats, warmup, min_total_s = min(repeats, QUICK["repeats"]), min(warmup, 1), 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        if QUICK["enabled"] and time.perf_counter() - t0 > QUICK["slow_s"]:
            return time.perf_counter() - t0  # a call this slow is its own steady state (anchors at full scale)
    synchronize(device)
    times: list[float] = []
    while len(times) < repeats or sum(times) < min_total_s:
        times.append(_sample(fn, device))
        if len(times) >= 10 * repeats:
            break
    return statistics.median(times)


def time_pair(fn: Callable[[], object], anchor: Callable[[], object], device: torch.device, *,
              repeats: int = 9, min_total_s: float = 0.0) -> tuple[float, float]:
    """Median wall times of ``fn()`` and ``anchor()``, sampled alternately, so that a slow spell of a shared
    machine falls on both and their ratio holds (two separate :func:`time_fn` runs of sub-millisecond calls
    can land in different spells)."""
    if QUICK["enabled"]:
        repeats, min_total_s = min(repeats, QUICK["repeats"]), 0.0
    fn(), anchor()
    synchronize(device)
    ours: list[float] = []
    theirs: list[float] = []
    while len(ours) < repeats or sum(ours) + sum(theirs) < min_total_s:
        ours.append(_sample(fn, device))
        theirs.append(_sample(anchor, device))
        if len(ours) >= 10 * repeats:
            break
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


# ---------------------------------------------------------------------------------------------
# Words for the demo: what each check string means, and one paragraph per op

TOLERANCE = 3e-3  # diff1, diff2 bound of the accumulating ops
# Anchors whose own result is not reproducible in some setting, and why (shown instead of a mismatch).
NONDETERMINISTIC_ANCHORS = {
    "spconv": "spconv's CPU convolutions are not thread-safe, so their result changes with the thread count "
              "({threads} threads here), while cvops's sparse convolutions give the same bits on any count. "
              "bench_sparse_conv.py --threads 1 compares the two exactly.",
}


@dataclass
class Verdict:
    kind: str      # "exact", "close", "same", "anchor-nondeterministic", "mismatch" or "unchecked"
    short: str     # a table cell
    worst: float = 0.0


def _diffs(check: str) -> list[float]:
    values = []
    for part in check.replace(" ", ",").split(","):
        if "=" in part:
            try:
                values.append(float(part.split("=", 1)[1]))
            except ValueError:
                pass
    return values


def verdict(row: BenchRow, limits: MachineLimits) -> Verdict:
    """Reads a benchmark's ``check`` string: ``exact``, ``diff1=..[,dx=..]``, ``pairs=spconv``, ``MISMATCH``..."""
    check = row.check.strip()
    if not check:
        return Verdict("unchecked", "not checked")
    if check == "exact":
        return Verdict("exact", "exact")
    if check.startswith("pairs="):
        return Verdict("same", "same as " + check.split("=", 1)[1])
    diffs = _diffs(check)
    if diffs and "FAIL" not in check:
        worst = max(diffs)
        if worst <= TOLERANCE:
            return Verdict("close", f"diff {worst:.0e}", worst)
        anchor = next((a for a in NONDETERMINISTIC_ANCHORS if row.anchor.startswith(a)), None)
        if anchor and limits.threads > 1:
            return Verdict("anchor-nondeterministic", f"{anchor} varies", worst)
        return Verdict("mismatch", "MISMATCH", worst)
    return Verdict("mismatch", "MISMATCH")


def speed(row: BenchRow, limits: MachineLimits) -> tuple[str, float]:
    """The limit an op is judged against: the copy bandwidth for pure IO, the roofline when it computes."""
    if row.flops:
        return "roofline", row.roofline_efficiency(limits)
    return "bandwidth", row.io_efficiency(limits)


def _span(values, fmt, unit: str = "") -> str:
    lo, hi = fmt(min(values)), fmt(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def demo_console():
    """A rich console at most 100 columns wide (100 when the output is not a terminal)."""
    from rich.console import Console
    console = Console()
    return Console(width=min(console.width, 100) if console.is_terminal else 100)


def summarize(rows: Sequence[BenchRow], limits: MachineLimits) -> list[tuple[str, str]]:
    """One ``(op, sentence)`` per op: did it match, how close to the machine's limit, against the anchor."""
    ops: dict[str, list[BenchRow]] = {}
    for r in rows:
        ops.setdefault(r.op, []).append(r)
    lines = []
    for op, group in ops.items():
        verdicts = [verdict(r, limits) for r in group]
        kinds = {v.kind for v in verdicts}
        checked = [v for v in verdicts if v.kind != "unchecked"]
        if "mismatch" in kinds:
            bad = [f"{r.case} {r.direction}" for r, v in zip(group, verdicts) if v.kind == "mismatch"]
            words = f"DID NOT MATCH its reference in {len(bad)} of {len(group)} runs ({', '.join(bad)})."
        elif not checked:
            words = "Not compared in this run (no reference or anchor for these cases)."
        elif kinds & {"exact", "same"} and not kinds & {"close", "anchor-nondeterministic"}:
            runs = f"all {len(checked)} compared runs" if len(checked) > 1 else "the compared run"
            words = (f"Matched bit for bit in {runs}"
                     + ("" if len(checked) == len(group) else f" ({len(group) - len(checked)} timed only)") + ".")
        else:
            close = [v.worst for v in checked if v.kind == "close"]
            words = (f"Matched within the {TOLERANCE:g} tolerance (largest difference {max(close):.1e})."
                     if close else "")
            if "anchor-nondeterministic" in kinds:
                row = next(r for r, v in zip(group, verdicts) if v.kind == "anchor-nondeterministic")
                worst = max(v.worst for v in checked if v.kind == "anchor-nondeterministic")
                name = next(a for a in NONDETERMINISTIC_ANCHORS if row.anchor.startswith(a))
                words += (f" Differs from {row.anchor} by {worst:.1e}, which is the anchor's own variation, "
                          f"not an error: " + NONDETERMINISTIC_ANCHORS[name].format(threads=limits.threads))
        limit, _ = speed(group[0], limits)
        effs = [speed(r, limits)[1] for r in group]
        ms = [r.seconds * 1e3 for r in group]
        what = "of the copy bandwidth" if limit == "bandwidth" else "of the roofline bound"
        words += f" Ran at {_span(effs, lambda v: f'{100 * v:.0f}', '%')} {what}, {_span(ms, _ms)} ms per call."
        anchored: dict[str, list[float]] = {}
        for r in group:
            if r.anchor_seconds:
                anchored.setdefault(r.anchor, []).append(r.anchor_seconds / r.seconds)
        for name, ratios in anchored.items():
            faster = min(ratios) >= 1
            slower = max(ratios) < 1
            verb = "faster than" if faster else "slower than" if slower else "the speed of"
            span = _span(ratios if not slower else [1 / x for x in ratios], lambda v: _times(v)[:-1], "x")
            words += f" {span} {verb} {name}."
        if not anchored:
            words += " No anchor timed in this run."
        lines.append((op, words.strip()))
    return lines


def _times(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def _ms(v: float) -> str:
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def print_demo(rows: Sequence[BenchRow], limits: MachineLimits, title: str, console=None) -> None:
    """The demo's output: a compact table (fits 100 columns) and one paragraph per op in words."""
    body = []
    for r in rows:
        limit, eff = speed(r, limits)
        ratio = _times(r.anchor_seconds / r.seconds) if r.anchor_seconds else ""
        direction = {"forward": "fwd", "backward": "bwd"}.get(r.direction, r.direction)
        body.append([r.op, r.case, direction, verdict(r, limits).short, _ms(r.seconds * 1e3),
                     f"{eff:.0%} {'BW' if limit == 'bandwidth' else 'roof'}", ratio])
    headers = ["op", "case", "dir", "result", "ms", "speed", "vs anchor"]
    summary = summarize(rows, limits)
    legend = ("speed: % of the copy bandwidth (BW) measured in this run, or, for ops that compute, of the "
              "roofline bound (roof: the larger of IO / bandwidth and FLOPs / measured matmul rate). "
              "vs anchor: anchor time / cvops time (>1: cvops faster); the anchors are named below.")
    try:
        from rich import box
        from rich.table import Table
    except ImportError:
        print(title)
        for line in [headers] + body:
            print(" | ".join(line))
        print(legend)
        for op, words in summary:
            print(f"\n{op}: {words}")
        return
    console = console or demo_console()
    table = Table(title=title, caption=legend, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
                  caption_justify="left")
    for h in headers:
        table.add_column(h, justify="right" if h in ("ms", "speed", "vs anchor") else "left", overflow="fold",
                         no_wrap=h != "case", min_width=20 if h == "case" else None)
    for line in body:
        style = "red" if line[3].startswith("MISMATCH") else None
        table.add_row(*line, style=style)
    console.print(table)
    console.print(f"[bold]{limits.describe()}[/bold]\n")
    grid = Table.grid(padding=(0, 1, 1, 0))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for op, words in summary:
        colour = "red" if "DID NOT MATCH" in words else "green"
        grid.add_row(f"[bold {colour}]{op}[/bold {colour}]", words)
    console.print(grid)


def plot_efficiency(rows: Sequence[BenchRow], limits: MachineLimits, path, title: str) -> bool:
    """A horizontal bar per op, case and direction: IO efficiency, with the roofline efficiency as a marker
    where the op computes. Needs matplotlib (the ``plot`` extra); returns False without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r.op} {r.case} {r.direction}" for r in rows]
    io = [100 * r.io_efficiency(limits) for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.6))
    colours = plt.cm.tab10.colors
    op_colour = {op: colours[i % len(colours)] for i, op in enumerate(dict.fromkeys(r.op for r in rows))}
    ypos = range(len(rows))[::-1]
    ax.barh(list(ypos), io, color=[op_colour[r.op] for r in rows])
    roof = [(y, 100 * r.roofline_efficiency(limits)) for y, r in zip(ypos, rows) if r.flops]
    if roof:
        ax.scatter([v for _, v in roof], [y for y, _ in roof], marker="|", s=120, color="black",
                   label="roofline efficiency (ops that compute)")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(list(ypos), labels, fontsize=7)
    ax.axvline(100, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel(f"IO efficiency, % of the measured copy bandwidth ({limits.bandwidth / 1e9:.1f} GB/s)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


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
