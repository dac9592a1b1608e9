"""Peak memory of every op on its CPU paths: on a large case a call adds its outputs and a bounded scratch to
the process's peak resident memory, never a widened copy of an input or a table the size of the whole input.

Each case runs in a fresh subprocess: one small call first (numba compiles there; compiler memory is not the
op's), then the peak (``VmHWM``) is reset through ``/proc/self/clear_refs`` and the large call is measured; every
output is a fresh allocation that counts (_core.memory keeps no buffers). glibc's
mmap threshold is pinned at 128 KiB: every large block is mapped on allocation and unmapped on free, so the peak
is what the op holds at once, not how glibc's adaptive threshold happened to reuse the heap (which moved the
same call's figure by 40 MB from one run to the next).
psroipool's peak test (both paths, a 100 MB float16 map) is in tests/test_memory.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import installed_cpu_paths

MIB = 1 << 20
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")

_RUNNER = """
import json, torch, cvops
torch.manual_seed(0)

def high_water():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024

def nbytes(result):
    if isinstance(result, torch.Tensor):
        return result.numel() * result.element_size()
    return sum(nbytes(t) for t in result)

{snippet}
build(large=False)()
call = build(large=True)
open("/proc/self/clear_refs", "w").write("5")
base = high_water()
result = call()
print(json.dumps(dict(grew=high_water() - base, outputs=nbytes(result))))
"""

# op -> a `build(large)` that makes the inputs and returns the call; `large` is network scale (tens of MB)
SNIPPETS = {
    "psamask_forward": """
def build(large, layout="{layout}"):
    h, w = (64, 64) if large else (6, 6)
    x = torch.randn(1, h, w, 225) if layout == "NHWC" else torch.randn(1, 225, h, w)
    return lambda: cvops.psamask_forward(x, "collect", 15, layout)
""",
    "psamask_backward": """
def build(large, layout="{layout}"):
    h, w = (64, 64) if large else (6, 6)
    g = torch.randn(1, h, w, h * w) if layout == "NHWC" else torch.randn(1, h * w, h, w)
    return lambda: cvops.psamask_backward(g, "distribute", 15, layout)
""",
    "masked_im2col": """
def build(large):
    h, w = (100, 168) if large else (5, 6)
    x = torch.randn(1, 256, h, w)
    hi, wi = torch.nonzero(torch.rand(h, w) < 0.3).unbind(1)
    return lambda: cvops.masked_im2col(x, hi, wi, 3, 1)
""",
    "masked_col2im": """
def build(large):
    h, w = (100, 168) if large else (5, 6)
    hi, wi = torch.nonzero(torch.rand(h, w) < 0.3).unbind(1)
    col = torch.randn(256, hi.numel())
    return lambda: cvops.masked_col2im(col, hi, wi, h, w)
""",
    "get_indice_pairs": """
def build(large, subm={subm}):
    n, shape = (200000, [41, 1440, 1440]) if large else (100, [5, 8, 8])
    coords = torch.stack([torch.randint(0, s, (2 * n,)) for s in shape], 1)
    coords = torch.unique(coords, dim=0)[torch.randperm(n)] if large else torch.unique(coords, dim=0)
    idx = torch.cat([torch.zeros(len(coords), 1, dtype=coords.dtype), coords], 1).int()
    return lambda: cvops.get_indice_pairs(idx, 1, shape, 3, 1 if subm else 2, 1, subm=subm)
""",
    "carafe_forward": """
def build(large, layout="{layout}"):
    h, w = (104, 168) if large else (5, 6)
    x, m = torch.randn(2, 256, h, w), torch.rand(2, 25, 2 * h, 2 * w)
    if layout == "NHWC":
        x, m = x.permute(0, 2, 3, 1).contiguous(), m.permute(0, 2, 3, 1).contiguous()
    return lambda: cvops.carafe_forward(x, m, 5, 1, 2, layout)
""",
    "carafe_backward": """
def build(large, layout="{layout}"):
    h, w = (104, 168) if large else (5, 6)
    x, m, g = torch.randn(2, 256, h, w), torch.rand(2, 25, 2 * h, 2 * w), torch.randn(2, 256, 2 * h, 2 * w)
    if layout == "NHWC":
        x, m, g = (t.permute(0, 2, 3, 1).contiguous() for t in (x, m, g))
    return lambda: cvops.carafe_backward(g, x, m, 5, 1, 2, layout)
""",
    "indice_conv": """
from cvops import sparse
def build(large):
    n, shape, c = (200000, [41, 1440, 1440], 64) if large else (100, [5, 8, 8], 4)
    coords = torch.unique(torch.stack([torch.randint(0, s, (2 * n,)) for s in shape], 1), dim=0)
    coords = coords[torch.randperm(len(coords))[:n]]
    idx = torch.cat([torch.zeros(len(coords), 1, dtype=coords.dtype), coords], 1).int()
    _, pairs, num = cvops.get_indice_pairs(idx, 1, shape, 3, 1, 1, subm=True)
    feats, weight = torch.randn(len(idx), c), torch.randn(27, c, c)
    return lambda: sparse.indice_conv(feats, weight, pairs, num, len(idx))
""",
    "dense_backward": """
from cvops import sparse
def build(large):
    n, shape, c = (40000, [4, 200, 176], 64) if large else (10, [2, 4, 4], 2)
    flat = torch.randperm(2 * shape[0] * shape[1] * shape[2])[:n]
    idx = torch.stack(torch.unravel_index(flat, (2, *shape)), 1).int()
    feats = torch.randn(n, c, requires_grad=True)
    grid = sparse.SparseConvTensor(feats, idx, shape, 2).dense()
    grad = torch.randn(grid.shape)
    return lambda: torch.autograd.grad(grid, feats, grad, retain_graph=True)
""",
}

SCRATCH = 8 * MIB  # allocator slack, row buffers, index vectors
# name, format arguments, the scratch a call may add beyond its outputs: a function of the outputs' bytes
CASES = [
    ("psamask_forward", {"layout": "NCHW"}, lambda out: SCRATCH),
    ("psamask_forward", {"layout": "NHWC"}, lambda out: SCRATCH),
    ("psamask_backward", {"layout": "NCHW"}, lambda out: SCRATCH),
    ("psamask_backward", {"layout": "NHWC"}, lambda out: SCRATCH),
    ("carafe_forward", {"layout": "NCHW"}, lambda out: SCRATCH),
    ("carafe_forward", {"layout": "NHWC"}, lambda out: SCRATCH),
    ("carafe_backward", {"layout": "NCHW"}, lambda out: SCRATCH),
    ("carafe_backward", {"layout": "NHWC"}, lambda out: SCRATCH),
    ("masked_im2col", {}, lambda out: SCRATCH),
    ("masked_col2im", {}, lambda out: SCRATCH),
    # the candidate (offset, site) lists: a few int64 words per pair found, below 1.5x the kernel map
    ("get_indice_pairs", {"subm": True}, lambda out: 1.5 * out + SCRATCH),
    ("get_indice_pairs", {"subm": False}, lambda out: 1.5 * out + SCRATCH),
    # a map not sorted by output row is sorted once (a copy of indice_pairs: 27 * 2 * 200000 int32), then
    # the destination-row blocks hold a few MiB per worker thread (each with its own malloc arena)
    ("indice_conv", {}, lambda out: 27 * 2 * 200000 * 4 + 4 * SCRATCH),
    # SparseConvTensor.dense()'s backward gathers the rows' gradients: no copy of the 72 MB grid's gradient
    ("dense_backward", {}, lambda out: SCRATCH),
]


def _measure(name: str, fmt: dict, path: str) -> dict:
    code = _RUNNER.format(snippet=SNIPPETS[name].format(**fmt))
    env = dict(os.environ, CVOPS_NUMBA="1" if path == "numba" else "0",
               MALLOC_MMAP_THRESHOLD_=str(128 << 10), MALLOC_TRIM_THRESHOLD_=str(128 << 10))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", installed_cpu_paths())
@pytest.mark.parametrize("name,fmt,scratch", CASES, ids=[f"{c[0]}-{'-'.join(map(str, c[1].values()))}" for c in CASES])
def test_peak_is_outputs_plus_bounded_scratch(name, fmt, scratch, path):
    got = _measure(name, fmt, path)
    allowed = got["outputs"] + scratch(got["outputs"])
    assert got["grew"] <= allowed, {**got, "allowed": allowed}
