"""Case files: ``cases/<op>.json`` at the repository root, shared by tests, benchmarks and the demo.

A file holds ``{"op": ..., "cases": [{"name": ..., "source": ..., "tags": [...], ...params}]}``.
Tags in use: ``unit`` (small, every layer incl. the loop reference), ``network`` (the docs'
network-scale cases, benchmarked by ``make bench``), ``demo`` (one network case per op and direction
for ``make demo``), ``quick`` (one tiny case per op: ``run_all.py --demo --quick``, the demo's test) and
``large`` (MLU gtest scale, too big for CI tests).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

CASES_DIR = Path(os.environ.get("CVOPS_CASES", Path(__file__).resolve().parents[2] / "cases"))


def load_cases(op: str, tag: str | None = None) -> list[dict]:
    path = CASES_DIR / f"{op}.json"
    cases = json.loads(path.read_text())["cases"]
    return [c for c in cases if tag is None or tag in c.get("tags", ())]


def case_id(case: dict) -> str:
    return case["name"]
