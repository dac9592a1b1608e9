"""Run every ``benchmarks/bench_<op>.py`` on its network-scale cases.

    python benchmarks/run_all.py --demo [--quick] [--picture PNG]   # make demo
    python benchmarks/run_all.py [--device cpu|cuda] [--tag network] [--only psamask,carafe]
                                 [--results DIR] [--plot] [--first-call]

``--demo`` runs the cases tagged ``demo`` (one network case per op and direction; ``--quick``: the tiny cases
tagged ``quick``) with quick timing, prints one line per case within 100 columns and one paragraph per op in
words, and draws one picture (matplotlib, the ``bench`` extra) of each row's share of the machine limit and
its speed-up over the anchor. Without ``--demo`` it prints the full table (time, IO, IO / compute / roofline
efficiency, anchor ratio); ``--results DIR`` also writes ``<device>-<date>.json`` and ``.md`` there, naming
the machine, and ``--plot`` draws the same picture there as ``<device>-<date>-speed.png``. Both measure the
share of the cores that other processes used before, during and after the run, and say when it was too
busy for the figures to be trusted. Progress is shown while the cases run, with each case's time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import time
import warnings
from pathlib import Path

import torch

import machine_load
from harness import MachineLimits, demo_console, load_module, print_table, set_quick
from report import plot_speed, print_demo

HERE = Path(__file__).resolve().parent
# Whole backbones (spconv's at two thread counts too) take a minute on a small CPU: `make bench` runs them.
DEMO_SKIP_MODULES = {"bench_spconv_backbones"}
CASE_LIMIT_S = 20  # a demo case slower than this is named as such (the demo's cases are chosen to stay under)


def load_bench_modules(wanted=()):
    """Every ``bench_*.py`` beside this file (or those named in ``wanted``), imported by path."""
    # bench_first_call.py times fresh processes, not cases: --first-call runs it on its own
    for path in sorted(p for p in HERE.glob("bench_*.py") if p.stem != "bench_first_call"):
        if wanted and path.stem.removeprefix("bench_") not in wanted:
            continue
        module = load_module(path)
        if hasattr(module, "run"):
            yield module


class _Progress:
    """A rich progress bar (plain lines without rich) fed by the case lists the benchmarks iterate."""

    def __init__(self, total_modules: int):
        self.rich = None
        try:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:
            self.console = None
        else:
            self.console = demo_console()
            self.rich = Progress(TextColumn("{task.description:<44}"), BarColumn(bar_width=24),
                                 TextColumn("{task.completed}/{task.total} ops"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
            self.task = self.rich.add_task("starting", total=total_modules)
        self.t0 = time.perf_counter()

    def __enter__(self):
        if self.rich:
            self.rich.start()
        return self

    def __exit__(self, *exc):
        if self.rich:
            self.rich.stop()

    def say(self, text: str) -> None:
        line = f"[{time.perf_counter() - self.t0:5.1f}s] {text}"
        if self.console:
            self.console.print(line, highlight=False)
        else:
            print(line, flush=True)

    def status(self, text: str) -> None:
        if self.rich:
            self.rich.update(self.task, description=text)

    def module_done(self) -> None:
        if self.rich:
            self.rich.advance(self.task)

    def track(self, module, limit_s: float | None = None) -> None:
        """Wraps the module's ``load_cases`` (where it has one) so each case announces itself as the
        benchmark reaches it and its time when done (marked when over ``limit_s``)."""
        load = getattr(module, "load_cases", None)
        if load is None:
            return
        progress = self

        def load_cases(op, tag=None):
            cases = load(op, tag)

            class Announcing(list):
                def __iter__(self):
                    for i, case in enumerate(list.__iter__(self)):
                        progress.status(f"{op}: {case['name']} ({i + 1}/{len(self)})")
                        start = time.perf_counter()
                        yield case
                        took = time.perf_counter() - start
                        over = f" (over the demo's {limit_s:g} s per case)" if limit_s and took > limit_s else ""
                        progress.say(f"{op} {case['name']}: {took:.1f}s{over}")
            return Announcing(cases)

        module.load_cases = load_cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tag", default=None, help="cases with this tag (default: network; demo with --demo)")
    parser.add_argument("--only", default="", help="comma-separated ops (bench_<op>.py names)")
    parser.add_argument("--demo", action="store_true", help="the demo: one case per op and direction, words")
    parser.add_argument("--quick", action="store_true", help="with --demo: the tiny cases tagged 'quick'")
    parser.add_argument("--picture", type=Path, default=None,
                        help="with --demo: where to draw the picture (default: build/demo/<device>-<tag>.png)")
    parser.add_argument("--results", type=Path, help="folder for a JSON and a markdown copy of the table")
    parser.add_argument("--plot", action="store_true", help="also draw the picture there (needs --results)")
    parser.add_argument("--first-call", action="store_true",
                        help="also time each op's first call in fresh processes (bench_first_call.py)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    device = torch.device(args.device)
    tag = args.tag or ("quick" if args.quick else "demo" if args.demo else "network")
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    if args.demo:
        set_quick(True)
        # third-party deprecation chatter (spconv's indexing, torch.fx's is_fx_tracing note) would break the
        # progress display; make bench keeps it
        warnings.filterwarnings("ignore", category=UserWarning, module=r"spconv(\..*)?")
        logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    modules = [m for m in load_bench_modules(wanted) if not (args.demo and m.__name__ in DEMO_SKIP_MODULES)]
    meter = machine_load.LoadMeter()
    rows = []
    with _Progress(len(modules)) as progress:
        progress.status("measuring the load of the machine (1 s)")
        before = meter.idle_share(1.0)
        run_start = meter.read()
        progress.status("measuring the machine's copy bandwidth and matmul rate")
        limits = MachineLimits.measure(device, copy_mib=128 if args.demo else 256)
        progress.say(limits.describe())
        for module in modules:
            progress.status(module.__name__.removeprefix("bench_"))
            progress.track(module, CASE_LIMIT_S if args.demo else None)
            rows += module.run(limits, tag=tag)
            progress.module_done()
        during = meter.share(run_start)
        progress.status("measuring the load of the machine (1 s)")
        after = meter.idle_share(1.0)
        progress.say(f"done: {len(rows)} runs")
    load_line = machine_load.describe(meter.cores, before, during, after)
    title = f"cvops on {device.type}: {tag} cases" + (", quick timing" if args.demo else "")
    if args.demo:
        print_demo(rows, limits, title, load_line)
        picture = args.picture or HERE.parent / "build" / "demo" / f"{device.type}-{tag}.png"
        draw(rows, limits, picture, title, load_line)
        print(f"\nThe demo took {time.perf_counter() - started:.0f} s after Python's start-up.")
        return 0
    print_table(rows, limits, title)
    print(load_line)
    first_lines = []
    if args.first_call:
        first_call = load_module(HERE / "bench_first_call.py")
        first_rows = first_call.run(list(first_call.SNIPPETS))
        first_call.print_rows(first_rows)
        first_lines = first_call.markdown(first_rows)
    if args.results:
        stem = write_results(args.results, rows, limits, device,
                             [load_line, *([""] + first_lines if first_lines else [])])
        if args.plot:
            draw(rows, limits, stem.with_name(stem.name + "-speed.png"), title, load_line)
    return 0


def draw(rows, limits: MachineLimits, path: Path, title: str, load_line: str) -> None:
    """The picture of ``rows`` at ``path`` (its folder created), and one line saying where it is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if plot_speed(rows, limits, path, title, [limits.describe(), load_line]):
        print(f"Picture: {path.resolve()}")
    else:
        print("No picture: matplotlib is not installed (pip install 'cvops[bench]').")


def write_results(folder: Path, rows, limits: MachineLimits, device: torch.device, extra_lines=()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.date.today().isoformat()
    stem = folder / f"{device.type}-{stamp}"
    records = [r.as_dict(limits) for r in rows]
    stem.with_suffix(".json").write_text(json.dumps({"date": stamp, "machine": limits.describe(),
                                                     "torch": torch.__version__, "rows": records}, indent=1))
    lines = [f"# cvops benchmark, {stamp}", "", limits.describe(), "",
             "| op | case | dir | backend | check | time ms | IO MB | IO eff | roofline | vs anchor |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        ratio = f"{r['anchor_seconds'] / r['seconds']:.2f}x {r['anchor']}" if r["anchor_seconds"] else ""
        lines.append(f"| {r['op']} | {r['case']} | {r['direction']} | {r['backend']} | {r['check']} | "
                     f"{r['seconds'] * 1e3:.3f} | {r['io_bytes'] / 1e6:.1f} | {r['io_efficiency']:.0%} | "
                     f"{r['roofline_efficiency']:.0%} | {ratio} |")
    if extra_lines:
        lines += ["", *extra_lines]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and {stem}.md")
    return stem


if __name__ == "__main__":
    sys.exit(main())
