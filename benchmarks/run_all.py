"""Run every ``benchmarks/bench_<op>.py`` on its network-scale cases and print one table.

    python benchmarks/run_all.py [--device cpu|cuda] [--tag network] [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

from cvops._core.bench import MachineLimits, print_table

HERE = Path(__file__).resolve().parent


def load_bench_modules():
    for path in sorted(HERE.glob("bench_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tag", default="network")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    limits = MachineLimits.measure(device)
    print(limits.describe(), flush=True)
    rows = []
    for module in load_bench_modules():
        rows += module.run(limits, tag=args.tag)
    print_table(rows, limits, f"cvops on {device.type}: {args.tag} cases")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": limits.describe(),
                                         "rows": [r.as_dict(limits) for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
