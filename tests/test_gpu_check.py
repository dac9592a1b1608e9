"""tools/gpu_check.py --dry-run: the GPU check's every section on the CPU under Triton's interpreter, so the
command a GPU session runs first cannot rot while no GPU is lent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = {"psamask", "masked_im2col", "psroipool", "carafe", "get_indice_pairs", "sparse_conv"}


def test_dry_run_checks_every_op_and_writes_its_report(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    correctness = report["sections"]["correctness"]
    checked = {r["op"] for r in correctness if isinstance(r["checks"], int) and r["checks"] > 0}
    assert checked == OPS
    assert all(r["ok"] is True for r in correctness), [r for r in correctness if r["ok"] is not True]
    assert {r["op"] for r in correctness if r["dtype"] == "float64"} >= {"psamask", "carafe", "sparse_conv"}
    speed_ops = {r["op"] for r in report["sections"]["speed"]}
    assert speed_ops >= {"psamask", "masked_im2col", "MaskedConv2d", "carafe", "psroipool", "get_indice_pairs"}
    assert all(r["ms"] > 0 for r in report["sections"]["speed"])
    (step,) = report["sections"]["sparse backbone step"]
    assert step["ms per step"] > 0 and "maps share" in step
    assert report["meta"]["copy bandwidth GB/s"] > 0
    markdown = (tmp_path / "gpu-check.md").read_text()
    assert "## correctness" in markdown and "correctness failures: 0" in markdown


def test_a_failed_comparison_fails_the_run(tmp_path, monkeypatch):
    """The exit status follows the comparisons: one planted wrong psamask result makes the command exit 1."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "tools"))
    import cvops
    real = cvops.psamask_forward

    def wrong(x, *args, backend=None, **kw):
        out = real(x, *args, backend=backend, **kw)
        return out + 1 if backend == "triton" else out

    monkeypatch.setattr(cvops, "psamask_forward", wrong)
    code = gpu_check.main(["--dry-run", "--out", str(tmp_path), "--only", "psamask", "--skip", "speed,backbone"])
    assert code == 1
    (row,) = [r for r in json.loads((tmp_path / "gpu-check.json").read_text())["sections"]["correctness"]]
    assert row["ok"] is False and "not bit-equal" in row["failed"]
