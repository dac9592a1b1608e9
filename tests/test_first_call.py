"""First calls of the numba kernels (``_core.jit``): compiled on the calling thread, so a fresh process gets
the kernels' bits from its very first call, a fork right after it returns at once and the child computes,
deterministic mode changes nothing, and ``python -m cvops.precompile`` leaves nothing to compile.

The fresh processes run with their own empty ``NUMBA_CACHE_DIR`` (the cold case; the rest of the suite
runs on a warm cache): one module fixture runs the first calls of every op once and keeps what the tests
check, so the cold compilation is paid once.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import requires_numba

pytestmark = requires_numba

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

# One first call of every op (forward, and backward where it has one) on small float32 inputs; each result a
# tuple of tensors. `kernels()` counts the compiled versions of each kernel module's numba functions.
_EVERY_OP = """
import json, os, sys, time
import torch
import cvops
import cvops.spconv as spconv
g = torch.Generator().manual_seed(0)
flat = torch.randperm(8 * 40 * 30, generator=g)[:500]
idx = torch.stack([torch.zeros_like(flat), flat // 1200, flat // 30 % 40, flat % 30], 1).int()
feat = torch.randn(1, 16, 12, 12, generator=g)
masks = torch.rand(1, 25, 24, 24, generator=g)
psx = torch.randn(1, 392, 14, 14, generator=g)
psa = torch.randn(1, 25, 9, 11, generator=g)
rois = torch.tensor([[0, 1.3, 2.1, 9.7, 11.2], [0, 0.5, 0.2, 13, 12.9]])
torch.manual_seed(0)
net = spconv.SparseSequential(spconv.SubMConv3d(4, 8, 3, indice_key="s1"), spconv.SparseConv3d(8, 8, 3, 2, 1))
feats = torch.randn(len(idx), 4, generator=g)

def grad(fn, *inputs):
    inputs = [t.clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.ones_like(out))
    return (out.detach(), *(t.grad for t in inputs))

def sparse_conv(f):
    return net(spconv.SparseConvTensor(f, idx, [8, 40, 30], 1)).features

OPS = {
    "psamask": lambda: grad(lambda x: cvops.psamask(x, "collect", 5), psa),
    "masked_im2col": lambda: (cvops.masked_im2col(feat, torch.tensor([0, 3, 7]), torch.tensor([1, 5, 11]), 3, 1),),
    "get_indice_pairs": lambda: cvops.get_indice_pairs(idx, 1, [8, 40, 30], 3, 1, 1, subm=True),
    "sparse_conv": lambda: grad(sparse_conv, feats),
    "carafe": lambda: grad(lambda f, m: cvops.carafe(f, m, 5, 1, 2), feat, masks),
    "psroi_pool": lambda: grad(lambda x: cvops.psroi_pool(x, rois, 7, 7, 1.0, 7, 8), psx),
}
PACKAGES = {"psamask": "cvops.ops.psamask", "masked_im2col": "cvops.ops.masked_im2col",
            "get_indice_pairs": "cvops.ops.get_indice_pairs", "sparse_conv": "cvops.sparse",
            "carafe": "cvops.ops.carafe", "psroi_pool": "cvops.ops.psroipool"}

def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))

def kernels(op):
    from numba.extending import is_jitted
    module = sys.modules.get(PACKAGES[op] + ".cpu_numba")
    return 0 if module is None else sum(len(v.signatures) for v in vars(module).values() if is_jitted(v))
"""

# The fresh process of the tests below: the first calls, then a fork, then deterministic mode switched on
_FIRST_CALLS = _EVERY_OP + """
first = {name: fn() for name, fn in OPS.items()}
compiled = {name: kernels(name) for name in OPS}
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    # one torch thread, as DataLoader workers run: torch's OpenMP pool does not survive a fork (a
    # multi-threaded torch.mm hangs in such a child, cvops or not)
    torch.set_num_threads(1)
    try:
        os._exit(0 if all(same(fn(), first[name]) for name, fn in OPS.items()) else 3)
    except BaseException:
        os._exit(4)
fork_s = time.perf_counter() - start
deadline = time.monotonic() + 300
while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        raise AssertionError("the child hangs")
    time.sleep(0.05)
torch.use_deterministic_algorithms(True)
deterministic = {name: same(OPS[name](), first[name]) for name in ("carafe", "psroi_pool", "sparse_conv")}
torch.save(first, sys.argv[1])
print(json.dumps({"compiled": compiled, "fork_s": fork_s, "child_exit": os.waitstatus_to_exitcode(done[1]),
                  "deterministic": deterministic}))
"""

# Another fresh process: the first calls only, saved
_SAVE_FIRST_CALLS = _EVERY_OP + """
torch.save({name: fn() for name, fn in OPS.items()}, sys.argv[1])
"""


def _run(code: str, cache_dir, *args: str, numba_switch=None) -> str:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), PYTHONPATH=SRC)
    env.pop("CVOPS_NUMBA", None)  # the default, unless the test names a switch
    if numba_switch is not None:
        env["CVOPS_NUMBA"] = numba_switch
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def first_calls(tmp_path_factory):
    """A fresh process with an empty numba cache and CVOPS_NUMBA unset: its report and first results."""
    tmp = tmp_path_factory.mktemp("first_calls")
    out = _run(_FIRST_CALLS, tmp / "numba-cache", str(tmp / "first.pt"))
    report = json.loads(out.strip().splitlines()[-1])
    return report, torch.load(tmp / "first.pt"), tmp


def test_a_fresh_process_gets_the_kernels_results_from_its_first_call(first_calls):
    report, first, tmp = first_calls
    assert all(n > 0 for n in report["compiled"].values()), report["compiled"]  # the kernels computed
    _run(_SAVE_FIRST_CALLS, tmp / "numba-cache", str(tmp / "wait.pt"), numba_switch="1")
    _run(_SAVE_FIRST_CALLS, tmp / "numba-cache", str(tmp / "torch.pt"), numba_switch="0")
    waiting, torch_path = torch.load(tmp / "wait.pt"), torch.load(tmp / "torch.pt")
    for name, result in first.items():
        assert len(result) == len(waiting[name]) and all(torch.equal(a, b) for a, b in zip(result, waiting[name])), name
    # a real check: some accumulating op's kernels and torch code differ in their last bits here (psroipool's
    # plain torch path sums in the kernel's order and may agree bit for bit)
    assert any(not all(torch.equal(a, b) for a, b in zip(first[name], torch_path[name]))
               for name in ("carafe", "psroi_pool"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_right_after_the_first_calls_returns_at_once_and_the_child_computes(first_calls):
    # issue 33: a fork waited for the background compile worker (minutes on an empty cache under load)
    report, _, _ = first_calls
    assert report["child_exit"] == 0, report["child_exit"]  # every op in the child: the parent's bits
    assert report["fork_s"] < 1.0, report["fork_s"]


def test_deterministic_mode_switched_on_mid_run_gives_the_kernels_bits_at_once(first_calls):
    # issue 33: after torch.use_deterministic_algorithms(True) the next calls gave the torch path's bits
    report, _, _ = first_calls
    assert report["deterministic"] == {"carafe": True, "psroi_pool": True, "sparse_conv": True}


def test_the_switch_is_read_on_every_call(monkeypatch):
    from cvops._core import jit
    from cvops._core.dispatch import resolve_backend

    def default():
        return resolve_backend("cvops.ops.psamask", "psamask", None, torch.device("cpu"), torch.zeros(1))
    monkeypatch.setenv("CVOPS_NUMBA", "0")
    assert not jit.numba_enabled() and default() == "torch"
    monkeypatch.setenv("CVOPS_NUMBA", "1")
    assert jit.numba_enabled() and default() == "numba"
    monkeypatch.delenv("CVOPS_NUMBA")
    assert jit.numba_enabled()  # the default: numba when it imports


def test_precompile_leaves_nothing_to_compile(tmp_path):
    # the sparse layers: the subm map and the compiled layer in two dtypes, also on two threads (the kernels'
    # ranges on cvops's pool: the same compiled code)
    cache = tmp_path / "numba-cache"
    out = _run("import sys; from cvops.precompile import main; sys.exit(main(['--ops', 'sparse_conv']))", cache)
    assert "kernel signatures compiled or loaded" in out
    check = textwrap.dedent("""
        import sys, torch
        from numba.extending import is_jitted
        from cvops._core import jit
        from cvops.precompile import _sparse_conv
        jit.use_parallel = lambda work, threshold=0: True  # the pool's ranges too
        torch.set_num_threads(2)
        for dtype in (torch.float32, torch.float64):
            _sparse_conv(dtype, "-")
        misses = {f"{name}.{k}": sum(v.stats.cache_misses.values()) for name, m in list(sys.modules.items())
                  if name.startswith("cvops") and name.endswith("cpu_numba")
                  for k, v in vars(m).items() if is_jitted(v) and sum(v.stats.cache_misses.values())}
        hits = sum(sum(v.stats.cache_hits.values()) for name, m in list(sys.modules.items())
                   if name.startswith("cvops") and name.endswith("cpu_numba")
                   for v in vars(m).values() if is_jitted(v))
        print(misses, hits)
        assert not misses and hits >= 2, (misses, hits)
        """)
    _run(check, cache)
