"""examples/: they run from an installed cvops, without the checkout's tests/ (nothing imported from it),
and sparse_encoder.py runs standalone at a tiny size from a folder outside the checkout."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_imports_nothing_from_the_checkout(path):
    modules = _imported_modules(path)
    assert "cvops" in modules or any(m.startswith("cvops.") for m in modules)
    assert not [m for m in modules if m.split(".")[0] in ("tests", "benchmarks")], modules
    assert "sys.path" not in path.read_text()


def test_sparse_encoder_runs_outside_the_checkout(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))  # only the package: as if installed
    env["CVOPS_NUMBA"] = "0"  # the torch path: what this checks is where the imports come from, not speed
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "sparse_encoder.py"), "--voxels", "400",
                          "--batch", "2", "--repeats", "1"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "400 voxels, batch 2" in run.stdout and "forward+backward:" in run.stdout
