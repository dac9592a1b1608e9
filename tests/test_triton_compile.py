"""Every Triton kernel compiles for real GPU targets (sm_80, sm_90a) within its register budget, unspilled.

The launches come from ``tests/support/triton_launches.py`` (every op, dtype, layout and mode on tiny
inputs) recorded under the interpreter; ``make gpu-report`` prints the same results as a table.
"""
from __future__ import annotations

import os

import pytest

from tests.conftest import requires_triton
from tests.support import triton_specs

pytestmark = [requires_triton, pytest.mark.skipif(not os.environ.get("TRITON_INTERPRET"),
                                                   reason="runs the kernels on CPU tensors under TRITON_INTERPRET=1")]


def _ptxas_bundled() -> bool:
    import triton
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))


@pytest.fixture(scope="module")
def recorded():
    from tests.support import triton_launches
    with triton_specs.Recorder() as recorder:
        triton_launches.exercise(recorder)
    return recorder.specs


@pytest.fixture(scope="module")
def compiled(recorded):
    if not _ptxas_bundled():
        pytest.skip("triton's NVIDIA backend (bundled ptxas) is not installed")
    return triton_specs.compile_specs(list(recorded))


def test_every_kernel_is_launched(recorded):
    kernels = triton_specs.launchable_kernels()
    assert len(kernels) >= 14
    assert kernels - {(s.module, s.kernel) for s in recorded} == set()


def test_every_specialisation_compiles_unspilled_within_budget(recorded, compiled):
    assert len(compiled) == len(recorded) * len(triton_specs.TARGETS)
    assert all(r.registers > 0 for r in compiled if not r.error)
    assert triton_specs.problems(compiled) == []


def test_int32_and_int64_specialisations_are_distinct(recorded):
    psamask = [s for s in recorded if s.kernel == "_psamask_forward_kernel"]
    assert psamask and all(dict(s.signature)["total"] == "i32" for s in psamask)


def test_occupancy_follows_registers_and_shared_memory():
    # 168 registers x 4 warps: 3 blocks of 21504 registers fit 65536 -> 12 of 64 warps
    assert triton_specs.occupancy(168, 0, 4, 90) == pytest.approx(12 / 64)
    assert triton_specs.occupancy(64, 0, 4, 90) == 0.5     # 64 registers: 32 warps' worth of registers
    assert triton_specs.occupancy(32, 0, 4, 90) == 1.0
    assert triton_specs.occupancy(32, 100 * 1024, 4, 80) == pytest.approx(4 / 64)


def test_problems_name_errors_spills_and_budget():
    spec = triton_specs.Spec("cvops.ops.psamask.triton", "k", (("x", "*fp32"),), (), (), 4)
    results = [triton_specs.Result(spec, "sm_80", registers=65),
               triton_specs.Result(spec, "sm_90a", registers=40, spill_bytes=8),
               triton_specs.Result(spec, "sm_90a", error="CompilationError: boom"),
               triton_specs.Result(spec, "sm_80", registers=64)]
    found = triton_specs.problems(results)
    assert len(found) == 3
    assert "65 registers > budget 64" in found[0] and "8 spill bytes" in found[1] and "boom" in found[2]


def _triton_results():
    """Outputs of every op's triton backend on small inputs (forward and backward)."""
    import torch

    import cvops
    from cvops.sparse.functional import indice_conv
    g = torch.Generator().manual_seed(0)
    out = []
    x = torch.randn(1, 9, 4, 5, generator=g)
    for mode in ("collect", "distribute"):
        y = cvops.psamask_forward(x, mode, 3, backend="triton")
        out += [y, cvops.psamask_backward(y, mode, 3, backend="triton")]
    f, m = torch.randn(1, 4, 3, 4, generator=g), torch.randn(1, 9, 6, 8, generator=g)
    y = cvops.carafe_forward(f, m, 3, 1, 2, backend="triton")
    out += [y, *cvops.carafe_backward(y, f, m, 3, 1, 2, backend="triton")]
    feat = torch.randn(1, 3, 5, 6, generator=g, requires_grad=True)
    mask = torch.rand(1, 5, 6, generator=g) > 0.5
    y = cvops.masked_conv2d(feat, mask, torch.randn(2, 3, 3, 3, generator=g), padding=1, backend="triton")
    y.sum().backward()
    out += [y, feat.grad]
    xp = torch.randn(1, 8, 6, 7, generator=g, requires_grad=True)
    rois = torch.tensor([[0, 0.0, 1.0, 5.0, 4.0], [0, 2.0, 0.0, 6.0, 5.0]])
    y, mapping = cvops.psroi_pool(xp, rois, 2, 2, 1.0, 2, 2, backend="triton")
    y.sum().backward()
    out += [y, mapping, xp.grad]
    idx = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 2], [0, 2, 2, 2]], dtype=torch.int32)
    _, pairs, num = cvops.get_indice_pairs(idx, 1, [3, 3, 3], 3, 1, 1, subm=True, backend="triton")
    feats = torch.randn(3, 4, generator=g, requires_grad=True)
    y = indice_conv(feats, torch.randn(27, 4, 5, generator=g), pairs, num, 3, identity_offset=13, backend="triton")
    y.sum().backward()
    return out + [pairs, y, feats.grad]


def test_int64_index_variants_give_the_int32_results():
    from cvops._core.indexing import forced_int64
    from cvops.metrics import bit_equal
    narrow = _triton_results()
    with forced_int64():
        wide = _triton_results()
    assert len(narrow) == len(wide) == 15
    for a, b in zip(narrow, wide):
        assert bit_equal(a, b)


def test_needs_int64_reads_tensor_spans():
    import torch

    from cvops._core.indexing import needs_int64, span
    t = torch.empty(0)
    assert span(t) == 0 and not needs_int64(t, 5)
    big = torch.empty(1, 1).expand(2**30 + 1, 1)           # stride 0: one element whatever the size
    assert span(big) == 1 and not needs_int64(big)
    view = torch.empty_strided((2, 3), (2**29, 1), device="meta")        # offsets up to 2**29 + 2: fits, with headroom
    assert span(view) == 2**29 + 3 and not needs_int64(view)
    assert needs_int64(torch.empty_strided((3, 1), (2**29, 1), device="meta"))
    assert needs_int64(2**30) and not needs_int64(2**30 - 1)
