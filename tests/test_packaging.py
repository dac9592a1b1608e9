"""The distribution: ``python -m build`` makes an sdist and a wheel that hold everything the library needs at
runtime (LICENSE included), and the wheel, installed into a fresh virtual environment, runs one call of every
op from outside the repository (no ``src/`` or ``cases/`` on the path).

The fresh venv reuses this interpreter's torch/numpy/numba (a ``.pth`` line naming its site-packages, so no
download); this interpreter's pip installs only the built wheel into it (``--no-deps``). Needs the ``build`` package
(the test extra); skipped without it.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("build")
setuptools = pytest.importorskip("setuptools")
if int(setuptools.__version__.split(".")[0]) < 77:  # pyproject's license fields (PEP 639); the test extra has it
    pytest.skip(f"setuptools {setuptools.__version__} < 77 cannot build without isolation", allow_module_level=True)
ROOT = Path(__file__).resolve().parents[1]

SMOKE = r"""
import importlib, importlib.metadata, os, pkgutil, sys
import torch
import cvops, cvops.mmcv
# every module of the installed package imports without the checkout (triton modules need triton)
for info in pkgutil.walk_packages(cvops.__path__, "cvops."):
    if not info.name.endswith(".triton") or importlib.util.find_spec("triton"):
        importlib.import_module(info.name)
assert os.path.realpath(cvops.__file__).startswith(os.path.realpath(sys.prefix)), cvops.__file__
assert any(r.startswith("numba") for r in importlib.metadata.requires("cvops")), "numba must be a dependency"
assert importlib.metadata.version("cvops") == cvops.__version__  # pyproject reads the one version
assert cvops.psamask(torch.randn(1, 9, 4, 4), "collect", 3).shape == (1, 16, 4, 4)
hi, wi = torch.tensor([0, 2]), torch.tensor([1, 3])
assert cvops.masked_im2col(torch.randn(1, 2, 4, 4), hi, wi, 3, 1).shape == (18, 2)
assert cvops.masked_col2im(torch.randn(3, 2), hi, wi, 4, 4).shape == (1, 3, 4, 4)
assert cvops.nn.MaskedConv2d(2, 3, 3, padding=1)(torch.randn(1, 2, 4, 4), torch.ones(1, 4, 4)).shape == (1, 3, 4, 4)
out, mapping = cvops.psroi_pool(torch.randn(1, 8, 6, 6), torch.tensor([[0, 0.0, 0, 4, 4]]), 2, 2, 1.0, 2, 2)
assert out.shape == (1, 2, 2, 2) and mapping.shape == (1, 2, 2, 2)
assert cvops.carafe(torch.randn(1, 2, 3, 3), torch.rand(1, 9, 6, 6), 3, 1, 2).shape == (1, 2, 6, 6)
assert cvops.mmcv.CARAFEPack(4, 2, compressed_channels=4)(torch.randn(1, 4, 3, 3)).shape == (1, 4, 6, 6)
indices = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2]], dtype=torch.int32)
out_indices, pairs, num = cvops.get_indice_pairs(indices, 1, [4, 4, 4], [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1])
assert out_indices.shape[1] == 4 and pairs.shape[0] == 27 and int(num.sum()) > 0
x = cvops.sparse.SparseConvTensor(torch.randn(2, 4), indices, [4, 4, 4], 1)
assert cvops.sparse.SubMConv3d(4, 8, 3, indice_key="k")(x).features.shape == (2, 8)
print("SMOKE OK", cvops.__file__)
"""


def _build(tmp_path: Path) -> tuple[Path, Path]:
    """Copy what a source checkout ships into tmp_path and build there (build/ and egg-info stay out of
    the repository; no isolated env, so no download of setuptools)."""
    src = tmp_path / "src_tree"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.nb*"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
                   check=True, capture_output=True, text=True)
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    return sdist, wheel


def _package_files() -> set[str]:
    return {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "cvops").rglob("*.py")}


def test_wheel_installs_into_fresh_venv_and_runs_every_op(tmp_path):
    sdist, wheel = _build(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert _package_files() <= names, sorted(_package_files() - names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the wheel must carry LICENSE"
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= members
    assert {f"src/{f}" for f in _package_files()} <= members

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # this interpreter's site-packages as a plain path line: its own .pth files (an editable cvops) stay inert
    (site / "host_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: the host's own (editable) cvops is visible through that path line, and pip would
    # otherwise count it as installed and skip the wheel
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    "--ignore-installed", str(wheel)], check=True, capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CVOPS_CASES")}
    run = subprocess.run([str(python), "-c", SMOKE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "SMOKE OK" in run.stdout and str(site) in run.stdout
