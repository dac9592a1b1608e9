"""psamask forward and backward on the cases of ``cases/psamask.json`` (default: PSANet scale).

    python benchmarks/bench_psamask.py [--tag network] [--backend cpu] [--check]
"""
from __future__ import annotations

import argparse

import torch

import cvops
from cvops._core.bench import BenchRow, MachineLimits, print_table, tensor_bytes, time_fn
from cvops._core.cases import load_cases
from cvops._core.metrics import bit_equal


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
            del x, out
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tag", default="network")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip comparing image 0 of each result with the loop reference")
    args = parser.parse_args()
    limits = MachineLimits.measure(args.device)
    print_table(run(limits, args.tag, args.backend, args.check), limits, f"psamask ({args.tag} cases)")


if __name__ == "__main__":
    main()
