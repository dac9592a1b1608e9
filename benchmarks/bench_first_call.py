"""First calls of each op in a fresh process, with an empty and with a filled numba cache.

    python benchmarks/bench_first_call.py [--ops carafe psamask ...] [--calls 20]

Each measurement is its own subprocess (a fresh interpreter: nothing imported, nothing compiled),
started with ``NUMBA_CACHE_DIR`` pointing at a new temporary folder. The first run of an op finds that
cache empty ("cold": numba compiles the kernels the calls need, on the calling thread), the second run of
the same op finds what the first wrote ("warm"). Each subprocess imports torch and cvops, builds a
network-like input, then times the op's first ``--calls`` calls (forward, and backward where the op has one)
and notes which of ``torch._dynamo``, ``triton`` and ``numba`` the calls imported. A third run with
``CVOPS_NUMBA=0`` times the torch code for comparison. ``carafepack`` (CARAFEPack(256, 2) forward +
backward on [2, 256, 52, 84]) and ``sparse_step`` (SubMConv3d + SparseConv3d forward + backward on 20,000
LiDAR-like voxels) are the first-call figures of docs/ARCHITECTURE.md. The ``numba start-up`` row times
numba alone (its import and one cached one-loop kernel): the part of a first call no op code can remove.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

# 4,000 sites of one KITTI-like grid [41, 160, 140] (batch 0), for the sparse snippets
_SITES = """
g = torch.Generator().manual_seed(0)
flat = torch.randperm(41 * 160 * 140, generator=g)[:4000]
idx = torch.stack([torch.zeros_like(flat), flat // (160 * 140), flat // 140 % 160, flat % 140], 1).int()
"""

# One snippet per op: builds inputs, then `call()` runs the op's first forward (+ backward).
SNIPPETS = {
    "carafe": """
x = torch.randn(2, 256, 13, 21, requires_grad=True)
m = torch.rand(2, 25, 26, 42).softmax(1).requires_grad_()
def call():
    cvops.carafe(x, m, 5, 1, 2).sum().backward()
""",
    "psamask": """
x = torch.randn(1, 97 * 97, 16, 32, requires_grad=True)
def call():
    cvops.psamask(x, "collect", (97, 97)).sum().backward()
""",
    "psroipool": """
x = torch.randn(1, 7 * 7 * 21, 38, 63, requires_grad=True)
rois = torch.tensor([[0, 16.0, 16.0, 400.0, 300.0], [0, 100.0, 50.0, 600.0, 500.0]])
def call():
    out = cvops.psroi_pool(x, rois, 7, 7, 1 / 16, 7, 21)[0]
    out.sum().backward()
""",
    "masked_conv2d": """
conv = cvops.nn.MaskedConv2d(256, 80, 3, padding=1)
x = torch.randn(1, 256, 100, 168)
mask = (torch.rand(1, 100, 168) < 0.1).float()
def call():
    with torch.no_grad():
        conv(x, mask)
""",
    "get_indice_pairs": _SITES + """
def call():
    cvops.get_indice_pairs(idx, 1, [41, 160, 140], 3, 1, 1, subm=True)
""",
    "sparse_conv": _SITES + """
import cvops.spconv as spconv
feats = torch.randn(4000, 16, generator=g, requires_grad=True)
net = spconv.SparseSequential(spconv.SubMConv3d(16, 16, 3, indice_key="s1"), spconv.SparseConv3d(16, 32, 3, 2, 1))
def call():
    net(spconv.SparseConvTensor(feats, idx, [41, 160, 140], 1)).features.sum().backward()
""",
}

SNIPPETS["carafepack"] = """
up = cvops.nn.CARAFEPack(256, 2)
x = torch.randn(2, 256, 52, 84, requires_grad=True)
def call():
    up(x).sum().backward()
"""
SNIPPETS["sparse_step"] = """
import cvops.spconv as spconv
from cvops.sparse.synthetic import lidar_voxels
idx = lidar_voxels(20000, 1, [41, 400, 352])
feats = torch.randn(len(idx), 16, requires_grad=True)
net = spconv.SparseSequential(spconv.SubMConv3d(16, 16, 3, indice_key="s1"), spconv.SparseConv3d(16, 32, 3, 2, 1))
def call():
    net(spconv.SparseConvTensor(feats, idx, [41, 400, 352], 1)).features.sum().backward()
"""

# The floor under every numba op: numba's import and the first call of a one-loop kernel from its disk cache.
SNIPPETS["numba start-up"] = """
import os, pathlib, sys
pathlib.Path(os.environ["NUMBA_CACHE_DIR"], "floor_kernel.py").write_text(
    "import numba\\n@numba.njit(cache=True)\\ndef total(a):\\n    s = 0.0\\n    for x in a:\\n        s += x\\n    return s\\n")
sys.path.insert(0, os.environ["NUMBA_CACHE_DIR"])
def call():
    import numpy, floor_kernel
    floor_kernel.total(numpy.ones(4))
"""

_RUNNER = """
import json, sys, time
t0 = time.perf_counter()
import torch, cvops
t1 = time.perf_counter()
{snippet}
before = set(sys.modules)
t2 = time.perf_counter()
calls = []
for _ in range({calls}):
    call()
    calls.append(time.perf_counter() - t2)
loaded = set(sys.modules) - before
print(json.dumps({{"import_s": t1 - t0, "calls_s": calls,
                  "imported": [m for m in ("torch._dynamo", "triton", "numba") if m in loaded]}}))
"""

# CVOPS_NUMBA per mode: unset (the default: numba) and "0" (the torch code)
MODES = {"numba": None, "torch": "0"}


def measure(op: str, cache_dir: str, mode: str, calls: int) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    env.pop("CVOPS_NUMBA", None)
    if MODES[mode] is not None:
        env["CVOPS_NUMBA"] = MODES[mode]
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _RUNNER.format(snippet=SNIPPETS[op], calls=calls)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(ops, calls: int = 20) -> list[dict]:
    rows = []
    for op in ops:
        with tempfile.TemporaryDirectory(prefix="cvops-numba-") as cache:
            row = {"op": op, "calls": calls, "cold": measure(op, cache, "numba", calls),
                   "warm": measure(op, cache, "numba", calls), "torch": measure(op, cache, "torch", calls)}
        rows.append(row)
    return rows


TITLE = ("first calls of each op in a fresh process, seconds from the first call's start to the end of call k; "
         "cold = empty numba cache, warm = filled, torch = CVOPS_NUMBA=0")
COLUMNS = ("op", "import", "1st cold", "1st warm", "2nd warm", "Nth cold", "Nth warm", "1st torch", "Nth torch",
           "imported by the calls (warm)")


def _cells(r: dict) -> tuple:
    cold, warm, plain = r["cold"]["calls_s"], r["warm"]["calls_s"], r["torch"]["calls_s"]
    return (r["op"], f"{r['warm']['import_s']:.2f}", f"{cold[0]:.2f}", f"{warm[0]:.2f}",
            f"{warm[min(1, len(warm) - 1)] - warm[0]:.3f}", f"{cold[-1]:.2f}", f"{warm[-1]:.2f}", f"{plain[0]:.2f}",
            f"{plain[-1]:.2f}", ", ".join(r["warm"]["imported"]) or "-")


def print_rows(rows) -> None:
    print(TITLE + (f" (N = {rows[0]['calls']})" if rows else ""))
    for cells in [COLUMNS] + [_cells(r) for r in rows]:
        print(f"{cells[0]:16s} " + " ".join(f"{c:>{len(h)}s}" for c, h in zip(cells[1:-1], COLUMNS[1:-1]))
              + f"  {cells[-1]}")


def markdown(rows) -> list[str]:
    """The rows as a markdown table (``run_all.py --results`` appends it to the results file)."""
    lines = [f"{TITLE}" + (f" (N = {rows[0]['calls']})" if rows else "") + ":", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    return lines + ["| " + " | ".join(_cells(r)) + " |" for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", nargs="*", default=list(SNIPPETS), choices=list(SNIPPETS))
    parser.add_argument("--calls", type=int, default=20, help="calls timed per process (N)")
    args = parser.parse_args()
    print_rows(run(args.ops, args.calls))


if __name__ == "__main__":
    main()
