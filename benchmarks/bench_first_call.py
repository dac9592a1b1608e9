"""First call of each op in a fresh process, with an empty and with a filled numba cache.

    python benchmarks/bench_first_call.py [--ops carafe psamask ...]

Each measurement is its own subprocess (a fresh interpreter: nothing imported, nothing compiled),
started with ``NUMBA_CACHE_DIR`` pointing at a new temporary folder. The first run of an op finds that
cache empty ("cold": numba compiles the kernels the call needs), the second run of the same op finds
what the first wrote ("warm"). Each subprocess imports torch and cvops, builds a small network-like
input, then times the op's first two calls (forward, and backward where the op has one), the time until
the background worker has every kernel they asked for ready, and which of ``torch._dynamo``, ``triton``
and ``numba`` were imported meanwhile. Both modes run: the default (kernels load and compile on a worker
thread while the calls run the torch path) and ``CVOPS_NUMBA=1`` (each call waits for its kernels).
The ``numba start-up`` row times numba alone (its import and one cached one-loop kernel): the part of a
waiting first call that no op code can remove.
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
call()
t3 = time.perf_counter()
call()
t4 = time.perf_counter()
loaded = set(sys.modules) - before
from cvops._core import jit_background
jit_background.run_until_ready(call)
t5 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "first_s": t3 - t2, "second_s": t4 - t3, "ready_s": t5 - t2,
                  "imported": [m for m in ("torch._dynamo", "triton", "numba") if m in loaded]}}))
"""

# CVOPS_NUMBA per mode: the default compiles in the background, "1" makes each call wait for its kernels
MODES = {"background": None, "wait": "1"}


def measure(op: str, cache_dir: str, mode: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    env.pop("CVOPS_NUMBA", None)
    if MODES[mode] is not None:
        env["CVOPS_NUMBA"] = MODES[mode]
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _RUNNER.format(snippet=SNIPPETS[op])], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(ops) -> list[dict]:
    rows = []
    for op in ops:
        row = {"op": op}
        for mode in MODES:
            with tempfile.TemporaryDirectory(prefix="cvops-numba-") as cache:
                row[mode] = {"cold": measure(op, cache, mode), "warm": measure(op, cache, mode)}
        rows.append(row)
    return rows


TITLE = ("first call of each op in a fresh process (s); cold = empty numba cache, warm = filled; "
         "default: kernels compile in the background, the torch path runs until they are ready; "
         "CVOPS_NUMBA=1: each call waits for its kernels")
COLUMNS = ("op", "import", "first call cold", "first call warm", "2nd call warm", "kernels ready cold",
           "kernels ready warm", "CVOPS_NUMBA=1 cold", "CVOPS_NUMBA=1 warm", "imported meanwhile (warm)")


def _cells(r: dict) -> tuple:
    bg, wait = r["background"], r["wait"]
    return (r["op"], f"{bg['warm']['import_s']:.2f}", f"{bg['cold']['first_s']:.2f}", f"{bg['warm']['first_s']:.2f}",
            f"{bg['warm']['second_s']:.3f}", f"{bg['cold']['ready_s']:.2f}", f"{bg['warm']['ready_s']:.2f}",
            f"{wait['cold']['first_s']:.2f}", f"{wait['warm']['first_s']:.2f}",
            ", ".join(bg["warm"]["imported"]) or "-")


def print_rows(rows) -> None:
    print(TITLE)
    for cells in [COLUMNS] + [_cells(r) for r in rows]:
        print(f"{cells[0]:16s} " + " ".join(f"{c:>{len(h)}s}" for c, h in zip(cells[1:-1], COLUMNS[1:-1]))
              + f"  {cells[-1]}")


def markdown(rows) -> list[str]:
    """The rows as a markdown table (``run_all.py --results`` appends it to the results file)."""
    lines = [f"{TITLE}:", "", "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    return lines + ["| " + " | ".join(_cells(r)) + " |" for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", nargs="*", default=list(SNIPPETS), choices=list(SNIPPETS))
    print_rows(run(parser.parse_args().ops))


if __name__ == "__main__":
    main()
