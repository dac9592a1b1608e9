"""Every Triton kernel compiles for real GPU targets (sm_80, sm_90a) within its register budget, unspilled.

The launches come from ``tests/support/triton_launches.py`` (every op, dtype, layout and mode on tiny
inputs) recorded under the interpreter; ``make gpu-report`` prints the same results as a table.
"""
from __future__ import annotations

import os

import pytest

from tests.conftest import requires_triton
from tests.support import triton_specs

pytestmark = requires_triton


def _ptxas_bundled() -> bool:
    import triton
    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))


@pytest.fixture(scope="module")
def recorded():
    if not os.environ.get("TRITON_INTERPRET"):
        pytest.skip("records launches under TRITON_INTERPRET=1 (set by conftest when there is no GPU)")
    from tests.support import triton_launches
    with triton_specs.Recorder() as recorder:
        triton_launches.exercise()
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
