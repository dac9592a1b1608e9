"""psamask forward and backward on the cases of ``cases/psamask.json`` (default: PSANet scale), each also
with ``out=`` (one output tensor reused) against a fresh output per call.

    python benchmarks/bench_psamask.py [--tag network] [--backend cpu] [--check]
"""
from __future__ import annotations


import torch

import cvops
from harness import BACKEND, NO_CHECK, BenchRow, MachineLimits, bench_main, tensor_bytes, time_fn, time_pair
from tests.support.cases import load_cases
from cvops.metrics import bit_equal


def make_input(case: dict, device, dtype=torch.float32, grad: bool = False) -> torch.Tensor:
    n, h, w = case["N"], case["H"], case["W"]
    c = h * w if grad else case["h_mask"] * case["w_mask"]
    shape = (n, c, h, w) if case["layout"] == "NCHW" else (n, h, w, c)
    return torch.randn(shape, device=device, dtype=dtype)


def run(limits: MachineLimits, tag: str = "network", backend: str | None = None, check: bool = True):
    device = limits.device
    rows = []
    for case in load_cases("psamask", tag):
        args = (case["psa_type"], (case["h_mask"], case["w_mask"]), case["layout"])
        for direction, fn in (("forward", cvops.psamask_forward), ("backward", cvops.psamask_backward)):
            x = make_input(case, device, grad=direction == "backward")
            out = fn(x, *args, backend=backend)
            verdict = ""
            if check:  # the loop reference takes seconds per image at PSANet scale: compare image 0
                verdict = "exact" if bit_equal(out[:1], fn(x[:1], *args, backend="reference")) else "MISMATCH"
            seconds = time_fn(lambda: fn(x, *args, backend=backend), device)
            name = backend or ("triton" if device.type == "cuda" else "cpu")
            rows.append(BenchRow("psamask", case["name"], direction, name, seconds,
                                 tensor_bytes(x, out), flops=0.0, check=verdict))
            # out=: one output written again and again, against a fresh output per call (its pages faulted in)
            kept = torch.full_like(out, float("nan"))
            seconds, fresh = time_pair(lambda: fn(x, *args, backend=backend, out=kept),
                                       lambda: fn(x, *args, backend=backend), device)
            rows.append(BenchRow("psamask", f"{case['name']} (out=)", direction, name, seconds, tensor_bytes(x, out),
                                 check="exact" if bit_equal(kept, out) else "MISMATCH", anchor="fresh output",
                                 anchor_seconds=fresh))
            del x, out, kept
    return rows


if __name__ == "__main__":
    bench_main(run, "psamask", __doc__, (BACKEND, NO_CHECK))
