"""The background mode of the numba kernels (``_core.jit_background``): the first calls of a process run
the torch path while a worker imports and compiles, later calls run the compiled kernels, the results
agree, and forks and mode switches stay safe. Fresh processes with an empty numba cache, since the rest
of the suite runs in the waiting mode (tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from cvops._core import jit, jit_background
from tests.conftest import requires_numba

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

# A subm kernel map (get_indice_pairs: the op whose kernels compile fastest), pure IO: both paths give
# the same bits. `compiled()` counts the compiled versions of the op's kernels.
_PRELUDE = """
import os, sys, time
import torch, cvops
from cvops._core import jit_background
g = torch.Generator().manual_seed(0)
flat = torch.randperm(8 * 40 * 30, generator=g)[:500]
idx = torch.stack([torch.zeros_like(flat), flat // 1200, flat // 30 % 40, flat % 30], 1).int()

def call():
    return cvops.get_indice_pairs(idx, 1, [8, 40, 30], 3, 1, 1, subm=True)

def compiled():
    module = jit_background._modules.get("cvops.ops.get_indice_pairs")  # set once the worker imported it
    return 0 if module is None else sum(len(d.overloads) for d in (module._serial, module._parallel))

def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def close(a, b, rel=1e-6):
    return all(float((x - y).abs().max()) <= rel * max(1.0, float(y.abs().max())) for x, y in zip(a, b))
"""


def _run(body: str, tmp_path, **env) -> str:
    environ = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=SRC, **env)
    environ.pop("CVOPS_NUMBA", None)
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(body)], env=environ,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@requires_numba
def test_first_call_runs_torch_path_then_kernels_take_over(tmp_path):
    out = _run("""
        first = call()
        assert compiled() == 0, "the first call waited for numba"
        later = jit_background.run_until_ready(call)
        assert compiled() > 0, "the kernels never became ready"
        assert same(first, later) and same(later, call())
        os.environ["CVOPS_NUMBA"] = "0"
        assert same(first, call())  # and the torch path alone agrees
        print("ok")
        """, tmp_path)
    assert out.strip() == "ok"


@requires_numba
def test_waiting_mode_compiles_on_the_calling_thread_after_a_background_import(tmp_path):
    # the worker imported the module with compilation deferred; CVOPS_NUMBA=1 hands it back to numba
    _run("""
        call()
        jit_background.wait_idle()
        assert compiled() == 0
        os.environ["CVOPS_NUMBA"] = "1"
        call()
        assert compiled() > 0 and jit_background.jobs_submitted() == 1  # the import only
        """, tmp_path)


# One first call of every op (forward, and backward where it has one), each result as a tuple of tensors;
# `exact` says whether the op is pure IO (bit-equal on both paths) or accumulates (diff1/diff2 <= 3e-3).
_EVERY_OP = """
from cvops.metrics import diff1, diff2
import cvops.spconv as spconv
torch.manual_seed(0)
feat = torch.randn(1, 16, 12, 12, generator=g)
masks = torch.rand(1, 25, 24, 24, generator=g)
psx = torch.randn(1, 392, 14, 14, generator=g)
psa = torch.randn(1, 25, 9, 11, generator=g)
rois = torch.tensor([[0, 1.3, 2.1, 9.7, 11.2], [0, 0.5, 0.2, 13, 12.9]])
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
    "psamask": (True, lambda: grad(lambda x: cvops.psamask(x, "collect", 5), psa)),
    "masked_im2col": (True, lambda: (cvops.masked_im2col(feat, torch.tensor([0, 3, 7]), torch.tensor([1, 5, 11]), 3, 1),)),
    "get_indice_pairs": (True, call),
    "sparse_conv": (False, lambda: grad(sparse_conv, feats)),  # torch loops vs the compiled layer: other BLAS
    "carafe": (False, lambda: grad(lambda f, m: cvops.carafe(f, m, 5, 1, 2), feat, masks)),
    "psroi_pool": (False, lambda: grad(lambda x: cvops.psroi_pool(x, rois, 7, 7, 1.0, 7, 8), psx)),
}

def agree(exact, a, b):
    if exact:
        return all(torch.equal(x, y) for x, y in zip(a, b))
    return all(x.dtype == y.dtype and (not x.is_floating_point() and torch.equal(x, y)
               or x.is_floating_point() and diff1(x, y) <= 3e-3 and diff2(x, y) <= 3e-3) for x, y in zip(a, b))
"""


@requires_numba
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_returns_at_once_after_the_first_calls_and_the_child_computes_every_op(tmp_path):
    # issue 33: a fork waited until the worker was idle (minutes on an empty cache under load); it returns at
    # once now, and the child computes every op (on the torch path when the worker was in a job at the fork)
    _run(_EVERY_OP + textwrap.dedent("""
        first = {name: fn() for name, (exact, fn) in OPS.items()}  # the worker imports and compiles now
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            # one torch thread, as DataLoader workers run: torch's OpenMP pool does not survive a fork (a
            # multi-threaded torch.mm hangs in such a child, cvops or not)
            torch.set_num_threads(1)
            try:
                bad = [name for name, (exact, fn) in OPS.items() if not agree(exact, fn(), first[name])]
                ready = [name for name, (exact, fn) in OPS.items()
                         if not agree(exact, jit_background.run_until_ready(fn), first[name])]
                os._exit(0 if not bad and not ready else 3)
            except BaseException:
                os._exit(4)
        took = time.perf_counter() - start
        deadline = time.monotonic() + 200
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                raise AssertionError("the child hangs")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(done[1]) == 0, os.waitstatus_to_exitcode(done[1])
        assert took < 1.0, f"the fork took {took:.2f} s"
        for name, (exact, fn) in OPS.items():  # and the parent goes on to its kernels
            assert agree(exact, jit_background.run_until_ready(fn), first[name]), name
        """), tmp_path)


@requires_numba
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_mid_job_runs_the_torch_path_and_an_idle_fork_keeps_numba(tmp_path):
    _run("""
        first = call()                          # the worker is importing numba now
        start = time.monotonic()
        while not jit_background._worker.running:  # (its thread may still be starting)
            assert time.monotonic() - start < 10
            time.sleep(0.001)
        pid = os.fork()
        if pid == 0:                            # numba's locks may be held by the parent's worker here
            from cvops._core import jit
            ok = jit_background.lost_at_fork() and jit.numba_mode() == "off" and same(call(), first)
            os.environ["CVOPS_NUMBA"] = "1"     # not even a waiting call touches numba
            ok = ok and jit.numba_mode() == "off" and same(call(), first) and jit_background.jobs_submitted() == 0
            os._exit(0 if ok else 3)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert not jit_background.lost_at_fork()
        later = jit_background.run_until_ready(call)
        assert not jit_background._worker.running
        pid = os.fork()
        if pid == 0:                            # forked between jobs: the kernels stay in use
            ok = not jit_background.lost_at_fork() and same(call(), later) and compiled() > 0
            os._exit(0 if ok else 3)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        """, tmp_path)


@requires_numba
def test_deterministic_mode_runs_the_kernels_from_the_first_call_after_the_switch(tmp_path):
    # issue 33: after torch.use_deterministic_algorithms(True) mid-run, the next calls of carafe and psroipool
    # still gave torch-path bits. Switched right after the first calls (the worker busy importing/compiling)
    # and after a while: the next call gives the kernels' bits, which differ from the torch path's here.
    out = _run(_EVERY_OP + textwrap.dedent("""
        for delay in (0.0, 0.3):
            for name in ("carafe", "psroi_pool"):
                exact, fn = OPS[name]
                os.environ["CVOPS_NUMBA"] = "0"
                torch_bits = fn()
                del os.environ["CVOPS_NUMBA"]
                fn()
                time.sleep(delay)
                torch.use_deterministic_algorithms(True)
                got = fn()
                torch.use_deterministic_algorithms(False)
                os.environ["CVOPS_NUMBA"] = "1"
                kernel_bits = fn()
                del os.environ["CVOPS_NUMBA"]
                assert not all(torch.equal(a, b) for a, b in zip(torch_bits, kernel_bits)), name  # a real check
                assert all(torch.equal(a, b) for a, b in zip(got, kernel_bits)), (name, delay)
        print("ok")
        """), tmp_path)
    assert out.strip() == "ok"


def test_mode_follows_the_switch_and_deterministic_algorithms(monkeypatch):
    monkeypatch.setenv("CVOPS_NUMBA", "0")
    assert jit.numba_mode() == "off" and jit.numba_kernels("cvops.ops.psamask", torch.zeros(1)) is None
    if not jit.numba_available():
        return
    monkeypatch.setenv("CVOPS_NUMBA", "1")
    assert jit.numba_mode() == "wait"
    monkeypatch.delenv("CVOPS_NUMBA")
    assert jit.numba_mode() == "background"
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert jit.numba_mode() == "wait"
    finally:
        torch.use_deterministic_algorithms(previous)


def test_a_failed_background_compile_hands_the_kernels_back():
    class Dispatcher:  # what a failed compilation touches of a numba dispatcher
        pass

    kernel, callee = Dispatcher(), Dispatcher()
    group = [kernel, callee]
    for d in group:
        d._compile_for_args = object()

    def compile_now():
        raise RuntimeError("typing failed")

    jit_background._compile(group, compile_now)
    assert group == [] and all("_compile_for_args" not in vars(d) for d in (kernel, callee))


@requires_numba
def test_no_kernel_compiles_on_the_calling_thread(tmp_path):
    # psamask compiles its kernels explicitly (LLVM's loop vectoriser off): those go to the worker too
    _run("""
        import threading
        from numba.core.dispatcher import Dispatcher
        threads = set()
        plain_compile = Dispatcher.compile
        def compile(self, sig):
            threads.add(threading.current_thread().name)
            return plain_compile(self, sig)
        Dispatcher.compile = compile
        x = torch.randn(1, 12, 10, 9 * 9, generator=g)  # NHWC: the row kernels, compiled explicitly
        first = cvops.psamask(x, "distribute", (9, 9), "NHWC")
        later = jit_background.run_until_ready(lambda: cvops.psamask(x, "distribute", (9, 9), "NHWC"))
        assert threads == {"cvops-numba"}, threads
        module = jit_background._modules["cvops.ops.psamask"]
        assert any(d.overloads for d in module.__cvops_dispatchers__)
        assert torch.equal(first, later)
        """, tmp_path)


@requires_numba
def test_sparse_conv_runs_torch_loops_until_its_compiled_layer_is_ready(tmp_path):
    # a layer not compiled yet runs on the torch loops, which add the same values in the same order but
    # multiply with torch's BLAS instead of SciPy's: the first call agrees with the later calls to rounding
    _run("""
        import cvops.spconv as spconv
        torch.manual_seed(0)
        net = spconv.SparseSequential(spconv.SubMConv3d(4, 8, 3, indice_key="s1"), spconv.SparseConv3d(8, 8, 3, 2, 1))
        feats = torch.randn(len(idx), 4, generator=g)

        def conv():
            net.zero_grad()
            f = feats.clone().requires_grad_()
            y = net(spconv.SparseConvTensor(f, idx, [8, 40, 30], 1)).features
            y.sum().backward()
            return y.detach(), f.grad, net[0].weight.grad.clone(), net[1].weight.grad.clone()

        first = conv()
        assert "cvops.sparse" not in jit_background._modules or not any(
            d.overloads for d in jit_background._modules["cvops.sparse"].__cvops_dispatchers__)
        later = jit_background.run_until_ready(conv)
        assert any(d.overloads for d in jit_background._modules["cvops.sparse"].__cvops_dispatchers__)
        assert close(first, later)
        """, tmp_path)
