"""cvops.sparse's CPU backends (torch: sparse/cpu.py, numba: sparse/cpu_numba.py): the compiled layer agrees with
the torch path to rounding (another BLAS), each backend gives the same bits on any thread count, and an error
reaches the caller."""
from __future__ import annotations

import pytest
import torch

from cvops import sparse
from cvops.metrics import bit_equal, diff1, diff2
from tests.ops._sparse_kmap import MAP_CASES, map_case


@pytest.mark.parametrize("case", list(MAP_CASES))
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_layer_matches_torch_path(case, threads, monkeypatch):
    """The compiled layer (cpu_numba, one call per direction) agrees with the torch path within 1e-6 relative,
    forward and both gradients, on 1 and 2 threads."""
    from cvops._core import jit
    if not jit.numba_available():
        pytest.skip("numba not installed")
    monkeypatch.setattr(jit, "use_parallel", lambda work, threshold=0: threads > 1)
    feats, weight, pairs, num, num_out, inverse, ident = map_case(**MAP_CASES[case], n=60, cin=5, cout=7)
    results = []
    for backend in ("torch", "numba"):
        f, w = feats.clone().requires_grad_(), weight.clone().requires_grad_()
        out = sparse.indice_conv(f, w, pairs, num, num_out, inverse=inverse, identity_offset=ident, backend=backend)
        gf, gw = torch.autograd.grad(out, (f, w), torch.linspace(-1, 1, out.numel()).reshape(out.shape))
        results.append((out.detach(), gf, gw))
    for a, b in zip(*results):
        assert float((a - b).abs().max()) <= 1e-6 * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("case", list(MAP_CASES))
def test_cpu_blocks_give_the_same_bits_on_any_thread_count(case, monkeypatch):
    """On 1 and 2 torch threads each CPU backend gives the same bits, and both match the reference: the torch
    path, and the numba path's destination-row blocks (here a few rows each, chunks of 3 pairs) on any thread,
    with the backward's blocks in one wave or in waves of two blocks per thread."""
    from cvops._core import jit
    partial_sizes = [None]
    if jit.numba_available():
        from cvops.sparse import cpu_numba
        partial_sizes = [cpu_numba.PARTIAL_BYTES, 1]
        monkeypatch.setattr(cpu_numba, "BLOCK_ROWS", (7, 7))
        monkeypatch.setattr(cpu_numba, "CHUNK_BYTES", 3 * 7 * 4)  # 3 rows of the widest side (7 channels, float32)
        monkeypatch.setattr(jit, "use_parallel", lambda work, threshold=0: torch.get_num_threads() > 1)
    feats, weight, pairs, num, num_out, inverse, ident = map_case(**MAP_CASES[case], n=60, cin=5, cout=7)
    grad = torch.linspace(-1, 1, num_out * weight.shape[2]).reshape(num_out, -1)
    backends = ("torch", "numba") if jit.numba_available() else ("torch",)
    threads = torch.get_num_threads()
    results = {backend: [] for backend in backends}
    try:
        for n_threads, partial in ((n, size) for n in (1, 2) for size in partial_sizes):
            torch.set_num_threads(n_threads)
            if partial is not None:
                monkeypatch.setattr(cpu_numba, "PARTIAL_BYTES", partial)
            for backend in backends:
                f, w = feats.clone().requires_grad_(), weight.clone().requires_grad_()
                out = sparse.indice_conv(f, w, pairs, num, num_out, inverse=inverse, identity_offset=ident,
                                         backend=backend)
                results[backend].append((out.detach(), *torch.autograd.grad(out, (f, w), grad)))
    finally:
        torch.set_num_threads(threads)
    for first, *others in results.values():
        for run in others:
            assert all(bit_equal(a, b) for a, b in zip(first, run))
    f, w = feats.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = sparse.indice_conv(f, w, pairs, num, num_out, inverse=inverse, identity_offset=ident, backend="reference")
    expected = (ref.detach(), *torch.autograd.grad(ref, (f, w), grad))
    for runs in results.values():
        for a, b in zip(runs[0], expected):
            assert diff1(a, b) < 1e-6 and diff2(a, b) < 1e-6


# ties in a narrow range (counting sort); a wide one (merge sort); int32's whole range (its span overflows int32)
@pytest.mark.parametrize("low, high", [(0, 9), (0, 1 << 30), (-(1 << 31), (1 << 31) - 1)])
@pytest.mark.parametrize("col", [0, 1])
def test_sort_pairs_numba_matches_torch(col, low, high):
    """sort_pairs_by_column: the numba sort gives the torch stable sort's map (ties keep their order, the
    slots past indice_num stay as they were), and an already sorted map comes back as it is."""
    from cvops._core import jit
    from cvops.sparse.kmap import sort_pairs_by_column
    if not jit.numba_available():
        pytest.skip("numba not installed")
    g = torch.Generator().manual_seed(23)
    pairs = torch.randint(low, high, (5, 2, 40), generator=g, dtype=torch.int32)
    num = torch.tensor([40, 0, 17, 1, 33], dtype=torch.int32)
    results = []
    for backend in ("torch", "numba"):
        results.append(sort_pairs_by_column(pairs, num, col, backend=backend))
        again = sort_pairs_by_column(results[-1], num, col, backend=backend)
        assert again is results[-1]
    assert torch.equal(results[0], results[1])
    for k in range(5):
        n = int(num[k])
        assert torch.all(results[1][k, col, :n].diff() >= 0)
        assert torch.equal(results[1][k, :, n:], pairs[k, :, n:])


def test_torch_path_error_reaches_the_caller_and_the_next_call_runs():
    """An out-of-range row that the trusted-map path let through is raised to the caller by the torch path,
    forward and backward, on 2 threads; the next call runs normally and the thread count is as it was."""
    from cvops.sparse import cpu
    from cvops.sparse.functional import _indice_conv
    feats, weight, pairs, num, num_out, inverse, ident = map_case(n=60, cin=5, cout=7)
    bad = pairs.clone()
    k = int(torch.nonzero(num).flatten()[0])
    bad[k, 0, 0] = 10**6
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for _ in range(2):
            f, w = feats.clone().requires_grad_(), weight.clone().requires_grad_()
            with pytest.raises((IndexError, RuntimeError)):
                _indice_conv(f, w, bad, num, num_out, inverse=False, identity_offset=-1,
                             indice_pairs_by_output=None, backend="torch", check_values=False)
            with pytest.raises((IndexError, RuntimeError)):
                cpu.backward(torch.ones(num_out, 7), feats, weight, bad, num, False, -1)
            out = sparse.indice_conv(f, w, pairs, num, num_out, backend="torch")
            ref = sparse.indice_conv(f, w, pairs, num, num_out, backend="reference")
            assert diff1(out, ref) < 1e-6
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
