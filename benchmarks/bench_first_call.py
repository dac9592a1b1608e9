"""First call of each op in a fresh process, with an empty and with a filled numba cache.

    python benchmarks/bench_first_call.py [--ops carafe psamask ...]

Each measurement is its own subprocess (a fresh interpreter: nothing imported, nothing compiled),
started with ``NUMBA_CACHE_DIR`` pointing at a new temporary folder. The first run of an op finds that
cache empty ("cold": numba compiles the kernels the call needs), the second run of the same op finds
what the first wrote ("warm"). Each subprocess imports torch and cvops, builds a small network-like
input, then times the op's first call (forward, and backward where the op has one) and reports
which of ``torch._dynamo``, ``triton`` and ``numba`` that call imported.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

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
    "get_indice_pairs": """
g = torch.Generator().manual_seed(0)
flat = torch.randperm(41 * 160 * 140, generator=g)[:4000]
idx = torch.stack([torch.zeros_like(flat), flat // (160 * 140), flat // 140 % 160, flat % 140], 1).int()
def call():
    cvops.get_indice_pairs(idx, 1, [41, 160, 140], 3, 1, 1, subm=True)
""",
}

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
print(json.dumps({{"import_s": t1 - t0, "first_s": t3 - t2, "second_s": t4 - t3,
                  "imported": [m for m in ("torch._dynamo", "triton", "numba") if m in loaded]}}))
"""


def measure(op: str, cache_dir: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", _RUNNER.format(snippet=SNIPPETS[op])], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(ops) -> list[dict]:
    rows = []
    for op in ops:
        with tempfile.TemporaryDirectory(prefix="cvops-numba-") as cache:
            cold = measure(op, cache)
            warm = measure(op, cache)
        rows.append({"op": op, "cold": cold, "warm": warm})
    return rows


def print_rows(rows) -> None:
    print("first call of each op in a fresh process (s); cold = empty numba cache, warm = filled")
    print(f"{'op':18s} {'import':>7s} {'cold':>7s} {'warm':>7s} {'2nd call':>9s}  imported by the first call (warm)")
    for r in rows:
        w, c = r["warm"], r["cold"]
        print(f"{r['op']:18s} {w['import_s']:7.2f} {c['first_s']:7.2f} {w['first_s']:7.2f} {w['second_s']:9.3f}  "
              f"{', '.join(w['imported']) or '-'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", nargs="*", default=list(SNIPPETS), choices=list(SNIPPETS))
    print_rows(run(parser.parse_args().ops))


if __name__ == "__main__":
    main()
