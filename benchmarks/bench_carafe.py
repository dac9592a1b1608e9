"""carafe forward and backward on the cases of ``cases/carafe.json`` (default: the FPN network scale).

    python benchmarks/bench_carafe.py [--tag network] [--backend cpu] [--no-anchor]

FLOPs are the algorithmic count: forward 2*k*k multiply-adds per output element; backward twice that
(grad_input and grad_mask). IO = all inputs + all outputs. The anchor is the straightforward torch
composite of the formula (unfold + einsum per sub-pixel phase, autograd for the backward), timed in
the same run on the first case of each layout it fits in memory for.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

import cvops
from harness import BACKEND, NO_ANCHOR, BenchRow, MachineLimits, bench_main, tensor_bytes, time_fn
from tests.support.cases import load_cases
from cvops.metrics import diff1

_ANCHOR_MAX_UNFOLD = 2**28  # elements of the composite's unfolded input (1 GiB in float32)


def make_inputs(case: dict, device, dtype=torch.float32):
    n, c, h, w = case["N"], case["C"], case["H"], case["W"]
    k, g, s = case["kernel_size"], case["group_size"], case["scale_factor"]
    x = torch.randn(n, c, h, w, device=device, dtype=dtype)
    m = torch.randn(n, g * k * k, h * s, w * s, device=device, dtype=dtype).view(n, g, k * k, h * s, w * s)
    m = m.softmax(2).view(n, g * k * k, h * s, w * s)
    gy = torch.randn(n, c, h * s, w * s, device=device, dtype=dtype)
    if case["layout"] == "NHWC":
        x, m, gy = (t.permute(0, 2, 3, 1).contiguous() for t in (x, m, gy))
    return x, m, gy


def composite(x, m, k, g, s):
    """unfold + einsum, one einsum per sub-pixel phase (NCHW)."""
    n, c, h, w = x.shape
    cols = F.unfold(x, k, padding=(k - 1) // 2).view(n, g, c // g, k * k, h * w)
    out = x.new_empty(n, c, h * s, w * s)
    for py in range(s):
        for px in range(s):
            mp = m[:, :, py::s, px::s].reshape(n, g, k * k, h * w)
            out[:, :, py::s, px::s] = torch.einsum("ngctp,ngtp->ngcp", cols, mp).reshape(n, c, h, w)
    return out


def run(limits: MachineLimits, tag: str = "network", backend: str | None = None, anchor: bool = True):
    device = limits.device
    rows = []
    anchored = set()
    for case in load_cases("carafe", tag):
        k, g, s, layout = case["kernel_size"], case["group_size"], case["scale_factor"], case["layout"]
        x, m, gy = make_inputs(case, device)
        name = backend or ("triton" if device.type == "cuda" else "cpu")
        macs = k * k * gy.numel()
        out = cvops.carafe_forward(x, m, k, g, s, layout, backend=backend)
        t_fwd = time_fn(lambda: cvops.carafe_forward(x, m, k, g, s, layout, backend=backend), device, repeats=5)
        grads = cvops.carafe_backward(gy, x, m, k, g, s, layout, backend=backend)
        t_bwd = time_fn(lambda: cvops.carafe_backward(gy, x, m, k, g, s, layout, backend=backend), device, repeats=5)
        fwd = BenchRow("carafe", case["name"], "forward", name, t_fwd, tensor_bytes(x, m, out), flops=2.0 * macs)
        bwd = BenchRow("carafe", case["name"], "backward", name, t_bwd, tensor_bytes(x, m, gy, *grads),
                       flops=4.0 * macs)
        unfolded = x.numel() * k * k
        if anchor and layout == "NCHW" and "NCHW" not in anchored and unfolded <= _ANCHOR_MAX_UNFOLD:
            anchored.add(layout)
            ref = composite(x, m, k, g, s)
            fwd.check = f"diff1={diff1(out, ref):.1e}"
            fwd.anchor, bwd.anchor = "unfold+einsum", "unfold+einsum autograd"
            fwd.anchor_seconds = time_fn(lambda: composite(x, m, k, g, s), device, repeats=3)
            xr, mr = x.clone().requires_grad_(), m.clone().requires_grad_()

            def anchor_backward():
                return torch.autograd.grad(composite(xr, mr, k, g, s), (xr, mr), gy)

            ref_grads = anchor_backward()
            bwd.check = f"diff1={max(diff1(a, b) for a, b in zip(grads, ref_grads)):.1e}"
            bwd.anchor_seconds = time_fn(anchor_backward, device, repeats=3)
            del ref, ref_grads, xr, mr
        rows += [fwd, bwd]
        del x, m, gy, out, grads
    return rows


if __name__ == "__main__":
    bench_main(run, "carafe", __doc__, (BACKEND, NO_ANCHOR))
