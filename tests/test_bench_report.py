"""The demo's report (benchmarks/report.py, benchmarks/machine_load.py, benchmarks/run_all.py --demo): check
strings read as verdicts, one paragraph per op in words, a table with every case on one line within 100
columns, the cache footnote, the machine's load in one line, the picture, and the quick demo end to end."""
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks import machine_load
from benchmarks import harness
from benchmarks.harness import BenchRow, MachineLimits
from benchmarks.report import CACHE_NOTE, format_table, plot_speed, print_demo, summarize, verdict
from tests.support.cases import load_cases

ROOT = Path(__file__).resolve().parents[1]
CASE_FILES = ("psamask", "carafe", "masked_im2col", "psroipool", "get_indice_pairs", "sparse_conv")
LIMITS = MachineLimits(torch.device("cpu"), bandwidth=40e9, matmul_flops=200e9, threads=2)
ROWS = [
    BenchRow("psamask", "psanet_b1_collect", "forward", "cpu", 0.004, 120_000_000, check="exact"),
    BenchRow("psamask", "psanet_b1_collect", "backward", "cpu", 0.002, 40_000_000, check="exact"),
    BenchRow("carafe", "fpn_carafe_p5", "forward", "cpu", 0.05, 160_000_000, 2e10, "diff1=9.0e-08",
             "unfold+einsum", 2.5),
    BenchRow("carafe", "fpn_carafe_p5_nhwc", "forward", "cpu", 0.04, 160_000_000, 2e10),
    BenchRow("get_indice_pairs", "centerpoint_subm", "forward", "cpu", 0.1, 60_000_000, check="pairs=spconv",
             anchor="spconv 2.x", anchor_seconds=0.08),
    BenchRow("psroipool", "doc_rfcn_g7", "backward", "cpu", 1e-4, 2_000_000, 1e6, "diff1=1.0e-02 FAIL"),
    BenchRow("sparse_conv", "centerpoint_quarter", "fwd+bwd", "cpu", 4.0, 500_000_000, 1e11,
             "diff1=2.6e-02,dx=3.6e-01", "spconv 2.3.8", 6.0),
    BenchRow("psroipool_ok", "rfcn_cls_r300", "forward", "cpu", 0.002, 30_000_000, 1e8, "diff1=0.0e+00"),
    BenchRow("MaskedConv2d", "p3 (10% masked)", "forward", "cpu", 0.04, 30_000_000, 1e9, "diff1=1e-7",
             "dense F.conv2d", 0.001),
    BenchRow("MaskedConv2d", "p3 (30% masked)", "forward", "cpu", 0.04, 30_000_000, 1e9, "diff1=1e-7",
             "dense F.conv2d", 1.0),
]


def test_verdicts():
    kinds = [verdict(r, LIMITS).kind for r in ROWS]
    assert kinds == ["exact", "exact", "close", "unchecked", "same", "mismatch", "anchor-nondeterministic",
                     "exact", "close", "close"]
    assert verdict(ROWS[0], LIMITS).short == verdict(ROWS[7], LIMITS).short == "bit-exact"  # zero diff: exact
    single = MachineLimits(torch.device("cpu"), 40e9, 200e9, threads=1)
    assert verdict(ROWS[6], single).kind == "mismatch"  # at one thread spconv is deterministic: a real gap
    assert verdict(BenchRow("x", "c", "f", "cpu", 1, 1, check="MISMATCH"), LIMITS).kind == "mismatch"


def test_summary_words():
    words = dict(summarize(ROWS, LIMITS))
    assert words["psamask"].startswith("Bit-exact in all 2 compared runs")
    assert "of the copy bandwidth" in words["psamask"] and "No anchor" in words["psamask"]
    assert "50-75%" in words["psamask"]  # 40 MB in 2 ms and 120 MB in 4 ms against 40 GB/s
    assert "2-4 ms per call" in words["psamask"]
    assert "tolerance" in words["carafe"] and "50x faster than unfold+einsum" in words["carafe"]
    assert words["get_indice_pairs"].startswith("The same result as spconv 2.x")
    assert "1.2x slower than spconv 2.x" in words["get_indice_pairs"]
    assert words["psroipool"].startswith("DID NOT MATCH") and "doc_rfcn_g7 backward" in words["psroipool"]
    assert "anchor's own variation, not an error" in words["sparse_conv"]
    assert "1.5x faster than spconv 2.3.8" in words["sparse_conv"] and "4 s per call" in words["sparse_conv"]
    assert words["psroipool_ok"].startswith("Bit-exact") and "tolerance" not in words["psroipool_ok"]
    assert "from 40x slower to 25x faster than dense F.conv2d" in words["MaskedConv2d"]


def _table_rows(lines, ops):
    return [line for line in lines if line.split(" ", 1)[0] in ops]


def test_demo_output_one_line_per_case_within_100_columns():
    out = io.StringIO()
    print_demo(ROWS, LIMITS, "demo", "Machine quiet: other processes used 2% of the 2 cores.", file=out)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100
    rows = _table_rows(lines, {r.op for r in ROWS})
    assert len(rows) == len(ROWS)
    for line, row in zip(rows, ROWS):
        assert row.case in line, line  # the whole name, never broken over two lines
    assert "MISMATCH" in out.getvalue() and "spconv varies" in out.getvalue()
    assert "Machine quiet" in out.getvalue()


def test_cache_footnote_marks_figures_over_100_percent():
    fast = BenchRow("psamask", "cached", "forward", "cpu", 1e-3, 80_000_000, check="exact")  # 80 MB/ms: 200%
    text = "\n".join(format_table([fast, ROWS[1]], LIMITS))
    assert "200% BW*" in text and "50% BW" in text and "50% BW*" not in text
    out = io.StringIO()
    print_demo([fast], LIMITS, "demo", file=out)
    assert CACHE_NOTE[:40] in " ".join(out.getvalue().split())
    out = io.StringIO()
    print_demo(ROWS[1:2], LIMITS, "demo", file=out)
    assert "* above 100%" not in out.getvalue()


def test_demo_case_names_fit_100_columns():
    """The table of the real demo cases (names as the benchmarks build them) fits without breaking a name."""
    rows = []
    for op in CASE_FILES:
        for case in load_cases(op, "demo"):
            rows.append(BenchRow(op, case["name"], "fwd+bwd", "cpu", 1.234, 10**8, check="diff1=3e-2",
                                 anchor="spconv 2.3.8", anchor_seconds=12.34))
            if op == "masked_im2col":
                rows.append(BenchRow("MaskedConv2d", f"{case['name']} (100% masked)", "forward", "cpu", 1.234,
                                     10**8, 1e9, "diff1=1.0e-07", "dense F.conv2d", 0.05))
            if op == "psroipool":  # 400% of the bandwidth: the widest figure a cached case shows
                rows.append(BenchRow(op, f"{case['name']}_1roi", "forward", "cpu", 1.234e-4, 2 * 10**7))
    assert {r.op for r in rows} >= {"psamask", "sparse_conv", "MaskedConv2d"}
    lines = format_table(rows, LIMITS)
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    assert len(lines) == len(rows) + 2


def test_table_cuts_the_result_column_where_one_space_still_overflows():
    """Cells that leave no room even with one space between columns: the result column is cut, never a name."""
    rows = [BenchRow("get_indice_pairs", "c" * 40, "forward", "cpu", 123.4, 10**8, check="diff1=3e-1",
                     anchor="spconv 2.3.8", anchor_seconds=1.0),
            BenchRow("MaskedConv2d", "ga_retina_p6_cls_30pct (27% masked)", "forward", "cpu", 1.2, 10**8)]
    lines = format_table(rows, LIMITS)
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    assert "c" * 40 in lines[2] and "~" in lines[2]

def test_load_line_subtracts_own_cpu_time(monkeypatch):
    clock = {"wall": 0.0, "busy": 100.0, "own": 5.0}
    monkeypatch.setattr(machine_load, "_busy_seconds", lambda: (clock["busy"], 4))
    monkeypatch.setattr(machine_load, "_own_seconds", lambda: clock["own"])
    monkeypatch.setattr(machine_load.time, "monotonic", lambda: clock["wall"])
    meter = machine_load.LoadMeter()
    start = meter.read()
    clock.update(wall=10.0, busy=130.0, own=15.0)  # 30 core-seconds busy in 10 s, 10 of them ours
    assert meter.share(start) == pytest.approx(20 / 40)
    assert machine_load.describe(4, 0.45, 0.5, 0.4).startswith("MACHINE BUSY: other processes used 50% of the 4 "
                                                              "cores during the run (45% before, 40% after)")
    assert machine_load.describe(4, 0.01, 0.03, 0.02).startswith("Machine quiet")
    assert "not measured" in machine_load.describe(0, None, None, None)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no /proc/stat")
def test_load_meter_sees_another_process():
    meter = machine_load.LoadMeter()
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.5)
        share = meter.idle_share(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert share >= 0.6 / meter.cores  # the spinner alone keeps one core busy


def test_quick_timing_samples_fast_calls_long_enough_and_slow_calls_once():
    calls = []

    def fast():
        calls.append(time.perf_counter())

    def slow():
        calls.append(time.sleep(0.12))

    harness.set_quick(True, min_s=0.02, max_s=1.0, slow_s=0.1)
    try:
        harness.time_fn(fast, torch.device("cpu"), repeats=3)
        assert len(calls) >= 4 and calls[-1] - calls[1] >= 0.015  # past 3 samples: 0.02 s of samples
        calls.clear()
        assert harness.time_fn(slow, torch.device("cpu"), repeats=7) >= 0.12
        assert len(calls) == 1  # a warm-up call slower than slow_s is the measurement
    finally:
        harness.set_quick(False)


def test_picture(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "speed.png"
    assert plot_speed(ROWS, LIMITS, path, "a title " * 30, ["CPU, 2 threads", "Machine quiet"])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_demo_end_to_end(tmp_path):
    """``run_all.py --demo --quick``: the tiny cases of every op through the real benchmarks, on the torch paths
    (CVOPS_NUMBA=0: compiling every kernel would take most of a minute and is not what this checks)."""
    pytest.importorskip("matplotlib")
    picture = tmp_path / "demo.png"
    env = dict(os.environ, CVOPS_NUMBA="0", COLUMNS="200",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--demo", "--quick",
                          "--picture", str(picture)], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    runs = int(re.search(r"done: (\d+) runs", run.stdout).group(1))
    ops = {"psamask", "carafe", "masked_im2col", "MaskedConv2d", "psroipool", "get_indice_pairs", "sparse_conv"}
    rows = _table_rows(lines, ops)
    assert len(rows) == runs >= 10
    names = {case["name"] for op in CASE_FILES for case in load_cases(op, "quick")}
    assert len(names) == len(CASE_FILES)  # one quick case per op
    for name in names:  # each case's whole name on one table line
        assert any(re.search(rf"\s{re.escape(name)}(\s|_1roi)", line) for line in rows), name
    assert re.search(r"^(MACHINE BUSY|Machine quiet|Machine load)", run.stdout, re.M)
    assert f"Picture: {picture.resolve()}" in run.stdout
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
