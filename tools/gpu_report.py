"""Compiles every Triton kernel for sm_80 and sm_90a (no GPU needed) and prints its resources.

    python tools/gpu_report.py            # the representative launches of tests/support/triton_launches.py
    python tools/gpu_report.py --tests    # every launch the triton op tests make (slower: runs those tests)

One row per kernel and target: specialisations compiled, warps, registers per thread (range over the
specialisations), the kernel's register budget, spill bytes, shared memory and the occupancy that follows
(resident warps / 64). Exits 1 on a compile error, a spill or registers over budget.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"   # record launches under the interpreter; compiling happens in workers
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.support import triton_specs  # noqa: E402


class _RecordTests:
    """pytest plugin: records launches for the whole session."""

    def __init__(self):
        self.recorder = triton_specs.Recorder()

    def pytest_sessionstart(self, session):
        self.recorder.__enter__()

    def pytest_sessionfinish(self, session, exitstatus):
        self.recorder.__exit__(None, None, None)


def record(from_tests: bool):
    if from_tests:
        import pytest
        plugin = _RecordTests()
        code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist", str(ROOT / "tests" / "ops"),
                            "-k", "triton"], plugins=[plugin])
        if code not in (0, 5):
            raise SystemExit(f"the triton tests failed (exit {code})")
        return plugin.recorder.specs
    from tests.support import triton_launches
    with triton_specs.Recorder() as recorder:
        triton_launches.exercise(recorder)
    return recorder.specs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", action="store_true", help="record the triton op tests' launches")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--targets", default=",".join(triton_specs.TARGETS))
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    specs = record(args.tests)
    t1 = time.perf_counter()
    results = triton_specs.compile_specs(list(specs), args.targets.split(","), workers=args.workers)
    t2 = time.perf_counter()
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(triton_specs.table(results))
    print(f"\n{len(specs)} specialisations of {len({(s.module, s.kernel) for s in specs})} kernels "
          f"({sum(specs.values())} launches) recorded in {t1 - t0:.0f} s, {len(results)} compiles in {t2 - t1:.0f} s "
          f"({cpu.ru_utime + cpu.ru_stime:.0f} CPU s in {args.workers} workers)")
    bad = triton_specs.problems(results)
    for line in bad:
        print("FAIL", line)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
