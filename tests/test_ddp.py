"""examples/ddp_train.py: two training steps on two gloo CPU processes leave identical parameters on both
ranks, and the parameters moved (the all-reduced gradients were applied)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch without gloo")
def test_two_ranks_hold_identical_parameters(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "ddp_train.py"), "--steps", "2",
                          "--save-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "step 1: loss" in run.stdout
    assert "ranks ended with equal parameters: yes" in run.stdout  # the example's own comparison
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank0.keys() == rank1.keys() and any("up.content_encoder" in k for k in rank0)
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import ddp_train
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    initial = ddp_train.TinyPSANet().state_dict()
    assert all(not torch.equal(initial[k], rank0[k]) for k in ("stem.weight", "head.weight", "up.content_encoder.weight"))
