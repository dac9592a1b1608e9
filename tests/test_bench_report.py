"""The demo's report (benchmarks/harness.py): check strings read as verdicts, one paragraph per op in words,
a table within 100 columns, the anchor's own nondeterminism named as such, and the efficiency plot."""
import io

import pytest
import torch

from benchmarks.harness import BenchRow, MachineLimits, plot_efficiency, print_demo, summarize, verdict

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
]


def test_verdicts():
    kinds = [verdict(r, LIMITS).kind for r in ROWS]
    assert kinds == ["exact", "exact", "close", "unchecked", "same", "mismatch", "anchor-nondeterministic"]
    single = MachineLimits(torch.device("cpu"), 40e9, 200e9, threads=1)
    assert verdict(ROWS[-1], single).kind == "mismatch"  # at one thread spconv is deterministic: a real gap
    assert verdict(BenchRow("x", "c", "f", "cpu", 1, 1, check="MISMATCH"), LIMITS).kind == "mismatch"


def test_summary_words():
    words = dict(summarize(ROWS, LIMITS))
    assert words["psamask"].startswith("Matched bit for bit in all 2 compared runs")
    assert "of the copy bandwidth" in words["psamask"] and "No anchor" in words["psamask"]
    assert "50-75%" in words["psamask"]  # 40 MB in 2 ms and 120 MB in 4 ms against 40 GB/s
    assert "tolerance" in words["carafe"] and "50x faster than unfold+einsum" in words["carafe"]
    assert "1.2x slower than spconv 2.x" in words["get_indice_pairs"]
    assert words["psroipool"].startswith("DID NOT MATCH") and "doc_rfcn_g7 backward" in words["psroipool"]
    assert "anchor's own variation, not an error" in words["sparse_conv"]
    assert "1.5x faster than spconv 2.3.8" in words["sparse_conv"]


def test_demo_output_fits_100_columns():
    rich = pytest.importorskip("rich.console")
    out = io.StringIO()
    print_demo(ROWS, LIMITS, "demo", console=rich.Console(file=out, width=100))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "MISMATCH" in text and "spconv varies" in text and "centerpoint_quarter" in text


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "io.png"
    assert plot_efficiency(ROWS, LIMITS, path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
