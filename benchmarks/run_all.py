"""Run every ``benchmarks/bench_<op>.py`` on its network-scale cases and print one table.

    python benchmarks/run_all.py [--device cpu|cuda] [--tag network] [--only psamask,carafe] [--results DIR]
                                 [--first-call]

``--results DIR`` also writes ``<device>-<date>.json`` and ``.md`` there, naming the machine.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import sys
from pathlib import Path

import torch

from cvops._core.bench import MachineLimits, print_table

HERE = Path(__file__).resolve().parent


def load_bench_modules():
    # bench_first_call.py times fresh processes, not cases: it runs on its own
    for path in sorted(p for p in HERE.glob("bench_*.py") if p.stem != "bench_first_call"):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tag", default="network")
    parser.add_argument("--only", default="", help="comma-separated ops (bench_<op>.py names)")
    parser.add_argument("--results", type=Path, help="folder for a JSON and a markdown copy of the table")
    parser.add_argument("--first-call", action="store_true",
                        help="also time each op's first call in fresh processes (bench_first_call.py)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    limits = MachineLimits.measure(device)
    print(limits.describe(), flush=True)
    rows = []
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    for module in load_bench_modules():
        if not wanted or module.__name__.removeprefix("bench_") in wanted:
            rows += module.run(limits, tag=args.tag)
    print_table(rows, limits, f"cvops on {device.type}: {args.tag} cases")
    if args.first_call:
        spec = importlib.util.spec_from_file_location("bench_first_call", HERE / "bench_first_call.py")
        first_call = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(first_call)
        first_call.print_rows(first_call.run(list(first_call.SNIPPETS)))
    if args.results:
        write_results(args.results, rows, limits, device)
    return 0


def write_results(folder: Path, rows, limits: MachineLimits, device: torch.device) -> None:
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
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and {stem}.md")


if __name__ == "__main__":
    sys.exit(main())
