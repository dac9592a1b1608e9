"""Output allocation (_core.memory): every output is a fresh tensor, never memory something still refers to;
outputs are resizable like any torch tensor; and the peak memory of psroipool on a large input."""
import json
import os
import subprocess
import sys

import pytest
import torch

import cvops
from cvops._core import memory
from tests.conftest import CPU_PATHS, default_to, requires_numba

BIG = (1 << 20,)  # 4 MiB of float32: large enough for the huge-page advice


def test_dtype_shape_and_zeros():
    z = memory.new_zeros((512, 1024), torch.float64)
    assert z.dtype == torch.float64 and z.shape == (512, 1024) and bool((z == 0).all())
    b = memory.new_zeros((1024, 256, 2), torch.bfloat16)  # 1 MiB: below the huge-page threshold
    assert b.dtype == torch.bfloat16 and bool((b == 0).all())
    e = memory.new_empty(BIG, torch.float32)
    assert e.shape == BIG and e.is_contiguous() and e.untyped_storage().nbytes() == BIG[0] * 4


def _hold(y: torch.Tensor, kind: str):
    """One reference to ``y``'s memory that outlives ``y``, and a function reading its values back."""
    if kind == "storage":
        dtype, shape, strides = y.dtype, y.shape, y.stride()  # the reader must not keep y alive
        return y.untyped_storage(), lambda s: torch.empty(0, dtype=dtype).set_(s, 0, shape, strides)
    if kind == "detached":
        return y.detach(), lambda t: t
    if kind == "numpy":
        return y.detach().numpy(), torch.from_numpy
    return torch.utils.dlpack.to_dlpack(y.detach()), torch.utils.dlpack.from_dlpack  # a DLPack capsule


HOLDERS = ["storage", "detached", "numpy", "dlpack"]


@pytest.mark.parametrize("kind", HOLDERS)
@pytest.mark.parametrize("path", CPU_PATHS)
def test_memory_still_referred_to_is_never_handed_out_again(path, kind, monkeypatch):
    # issue 33: `s = y.untyped_storage(); del y` and the next call of the same size overwrote `s` (the recycler
    # read a storage's use count, which a Python storage object does not hold), and a recycler that took one
    # outside reference for idle overwrote a kept `y.detach()`
    default_to(path, monkeypatch)
    torch.manual_seed(0)
    side = 40 + HOLDERS.index(kind) + 4 * (path == "numba")  # a size of its own: no other test's leftovers
    x = torch.randn(1, 81, side, side)
    y = cvops.psamask(x, "collect", 9)  # [1, side**2, side, side]: 10 MiB and more
    expected = y.clone()
    holder, read = _hold(y, kind)
    del y
    for _ in range(3):
        z = cvops.psamask(-x, "collect", 9)  # same size, other values
        assert not torch.equal(z, expected)
        del z
    assert torch.equal(read(holder), expected)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_outputs_are_resizable_like_torch_tensors():
    a = memory.new_empty(BIG, torch.float32)
    a.resize_(BIG[0] * 2)  # grows the storage, as torch.empty's would
    assert a.numel() == BIG[0] * 2
    a.fill_(1.0)
    b = memory.new_empty(BIG, torch.float32)
    b.untyped_storage().resize_(0)
    assert b.untyped_storage().nbytes() == 0
    c = memory.new_empty(BIG, torch.float32)
    assert c.untyped_storage().nbytes() == BIG[0] * 4
    c.fill_(2.0)
    assert bool((a == 1.0).all())


@pytest.mark.parametrize("path", ["torch", pytest.param("numba", marks=requires_numba)])
def test_op_outputs_are_resizable(path, monkeypatch):
    default_to(path, monkeypatch)
    feature = torch.randn(1, 64, 64, 64)
    idx = torch.arange(4096) % 64
    outs = [cvops.masked_im2col(feature, idx, idx, 3, 1),                     # 9 MiB
            cvops.psamask(torch.randn(1, 9, 32, 32), "collect", 3),          # 4 MiB
            cvops.carafe(torch.randn(1, 64, 32, 32), torch.rand(1, 25, 64, 64), 5, 1, 2)]
    rois = torch.tensor([[0, 1.0, 2, 9, 11], [0, 0, 0, 13, 13]])
    outs += cvops.psroi_pool(torch.randn(1, 392, 14, 14), rois, 7, 7, 1.0, 7, 8)
    sites = torch.tensor([[0, 0, 1, 2], [0, 1, 1, 2], [0, 3, 0, 0]], dtype=torch.int32)
    feats = torch.randn(3, 4)
    sparse = cvops.sparse.SparseConvTensor(feats, sites, [4, 4, 4], 1)
    outs.append(cvops.sparse.SubMConv3d(4, 8, 3, indice_key="k")(sparse).features.detach())
    # the callers' inputs stay resizable too (Tensor.numpy() would have pinned their storages)
    outs += [feature, idx, rois, sites, feats]
    for out in outs:
        shape = out.shape
        out.untyped_storage().resize_(out.untyped_storage().nbytes() + 64)
        out.resize_(out.numel() + 16)
        out[-16:] = 0
        out.resize_(shape)
        out.untyped_storage().resize_(0)
        assert out.untyped_storage().nbytes() == 0


def test_empty_cache_returns_free_heap_memory_to_the_system():
    # cvops holds no buffers (it returns 0), but free heap memory torch's allocator left behind goes back:
    # freed 1 MiB blocks between live small ones stay resident (glibc trims only the top of the heap)
    # until malloc_trim
    big = torch.ones(30 << 18)
    del big  # glibc raises its mmap threshold: 1 MiB blocks now come from the heap
    keep, drop = [], []
    for _ in range(64):
        drop.append(torch.ones(1 << 18))
        keep.append(torch.ones(16))
    del drop
    before = _rss()
    assert cvops.empty_cache() == 0
    assert before - _rss() >= 32 << 20, (before, _rss())
    del keep


_PSROI_PEAK = """
import json, resource, torch, cvops
from cvops.ops.psroipool import cpu, cpu_numba
dtype, direction, numba = {dtype}, {direction!r}, {numba}
shape, p, od = (1, 100, 250, 4 * 500), 2, 500
rois = torch.tensor([[0, 0, 0, 249, 99], [0, 10, 10, 200, 90], [0, -5, -5, 300, 120], [0, 3, 4, 5, 6]], dtype=dtype)
small = torch.ones(1, 3, 3, 4 * 500, dtype=dtype)  # compile/warm up first: numba/LLVM memory is not the op's
out, m = cvops.psroi_pool(small, rois, p, p, 1.0, p, od, "NHWC")
cvops.psroi_pool_backward(torch.ones_like(out), rois, m, 1.0, od, tuple(small.shape), "NHWC")
if direction == "forward":
    x = torch.full(shape, 0.5, dtype=dtype)
else:
    x = torch.full((4, p, p, od), 0.5, dtype=dtype)
    m = m.clone()
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = peak()
if direction == "forward":
    result = cvops.psroi_pool(x, rois, p, p, 1.0, p, od, "NHWC")[0]
    outputs = 2 * result.numel() * (result.element_size() + 4)  # output + mapping, and the fp32 sums
else:
    result = cvops.psroi_pool_backward(x, rois, m, 1.0, od, shape, "NHWC")
    outputs = result.numel() * result.element_size()
if numba:  # a band scratch per thread (cpu_numba.BAND_BYTES or one row)
    scratch = torch.get_num_threads() * max(cpu_numba.BAND_BYTES, shape[2] * p * p * cpu_numba._run_length(od) * 4)
else:  # tables of a few channels (cpu.TABLE_BYTES, float64 while NaN/inf are counted)
    scratch = 3 * cpu.TABLE_BYTES
print(json.dumps(dict(grew=peak() - base, allowed=outputs + scratch, input=x.numel() * x.element_size())))
"""


@pytest.mark.parametrize("path", ["torch", pytest.param("numba", marks=requires_numba)])
@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.float32, marks=pytest.mark.slow)])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_psroipool_peak_memory_is_inputs_outputs_and_a_bounded_scratch(path, dtype, direction):
    # a 100 MB float16 (200 MB float32) map, 4 RoIs over all of it: the call may add its outputs and the bounded
    # scratch its docstring states to the peak RSS, nothing like a widened copy or a table of the whole map
    code = _PSROI_PEAK.format(dtype=dtype, direction=direction, numba=path == "numba")
    env = dict(os.environ, CVOPS_NUMBA="1" if path == "numba" else "0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    slack = 24 << 20  # allocator and interpreter noise
    assert got["grew"] <= got["allowed"] + slack, got
