"""psroipool against torchvision's ``ps_roi_pool`` on the cases of ``cases/psroipool.json`` (default: R-FCN
ResNet-101 at 600x1000, the VOC cls map (21 x 7x7 channels), the bbox map (8 x 7x7) and the COCO cls map, with
128/300/2000 RoIs), forward and backward, at 1 and 2 threads, plus one small RoI (the fixed cost of a call).

    python benchmarks/bench_psroipool.py [--tag network] [--threads 1,2] [--backend cpu] [--no-check]

Both sides run in torchvision's convention and layout: ``cvops.torchvision.ps_roi_pool`` on an NCHW map against
``torchvision.ops.ps_roi_pool`` (timed alternately, ``harness.time_pair``); the backward is
``torch.autograd.grad`` of each output. torchvision's CPU kernel runs on one thread whatever the thread count.
Without torchvision only cvops is timed. The check compares the forward with torchvision's and the backward with
cvops' loop reference on a subsample of the RoIs (torchvision's own backward clamps bins differently, see
``cvops.ops.psroipool``).

IO bytes (MLU-OPS): forward = input + rois + output; backward = top_grad + rois + bottom_grad.
"""
from __future__ import annotations

import torch

import cvops
from harness import BACKEND, NO_CHECK, BenchRow, MachineLimits, tensor_bytes, time_pair, time_fn
from tests.support.cases import load_cases
from cvops.metrics import diff1, diff2
from tests.support.inputs.psroipool import case_input, case_rois

ANCHOR = "torchvision"


def _torchvision():
    """torchvision's ``ps_roi_pool``, or None where torchvision does not import (or has no kernel here)."""
    try:
        from torchvision.ops import ps_roi_pool
        ps_roi_pool(torch.zeros(1, 1, 2, 2), torch.zeros(1, 5), 1)
    except Exception:  # noqa: BLE001 - absent, or a build whose kernels do not load with this torch
        return None
    return ps_roi_pool


def _verdict(actual, expected) -> str:
    d1, d2 = diff1(actual, expected), diff2(actual, expected)
    return f"diff1={d1:.1e}" + ("" if max(d1, d2) <= 3e-3 else " FAIL")


def _timed(ours, theirs, device, repeats):
    """(our seconds, anchor seconds or None)."""
    if theirs is None:
        return time_fn(ours, device, repeats=repeats), None
    return time_pair(ours, theirs, device, repeats=repeats)


def run(limits: MachineLimits, tag: str = "network", backend: str | None = None, check: bool = True):
    """BenchRows of every case at torch's current thread count, anchored on torchvision where it imports (CPU)."""
    device = limits.device
    name = backend or ("triton" if device.type == "cuda" else "cpu")
    tv = _torchvision() if device.type == "cpu" else None  # tools/gpu_check.py anchors the CUDA runs
    anchor = f"{ANCHOR} {torch.get_num_threads()}t" if tv else ""
    rows = []
    for case in load_cases("psroipool", tag):
        if "error" in case:
            continue
        ph, pw, scale, od = case["pooled_height"], case["pooled_width"], case["spatial_scale"], case["output_dim"]
        if ph != pw:
            continue  # torchvision's convention: PH == PW == group size
        x = case_input(case).permute(0, 3, 1, 2).contiguous().to(device)
        rois = case_rois(case).to(device)

        def ours(inp, boxes=rois):
            return cvops.psroi_pool(inp, boxes, ph, pw, scale, ph, od, backend=backend, convention="torchvision")[0]
        out = ours(x)
        verdict = _verdict(out.cpu(), tv(x, rois, ph, scale)) if check and tv else ""
        seconds, theirs = _timed(lambda: ours(x), tv and (lambda: tv(x, rois, ph, scale)), device, 15)
        rows.append(BenchRow("psroipool", case["name"], "forward", name, seconds, tensor_bytes(x, rois, out),
                             check=verdict, anchor=anchor, anchor_seconds=theirs))

        one = torch.tensor([[0.0, 100, 100, 200, 200]], device=device)  # one small RoI: the fixed cost of a call
        seconds, theirs = _timed(lambda: ours(x, one), tv and (lambda: tv(x, one, ph, scale)), device, 50)
        rows.append(BenchRow("psroipool", f"{case['name']}_1roi", "forward", name, seconds,
                             tensor_bytes(one) + 2 * od * ph * pw * 4, anchor=anchor, anchor_seconds=theirs))

        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya = ours(xa)
        verdict = ""
        if check:  # the loop reference on a subsample of the RoIs
            pick = torch.arange(0, len(rois), max(len(rois) // 16, 1), device=device)
            _, mapping = cvops.psroi_pool(x, rois[pick], ph, pw, scale, ph, od, backend=backend,
                                          convention="torchvision")
            args = (grad[pick], rois[pick], mapping, scale, od, tuple(x.shape))
            mine = cvops.psroi_pool_backward(*args, backend=backend, convention="torchvision")
            ref = cvops.psroi_pool_backward(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args),
                                            backend="reference", convention="torchvision")
            verdict = _verdict(mine.cpu(), ref)
        yb = tv(xb, rois, ph, scale) if tv else None
        seconds, theirs = _timed(lambda: torch.autograd.grad(ya, xa, grad, retain_graph=True),
                                 tv and (lambda: torch.autograd.grad(yb, xb, grad, retain_graph=True)), device, 15)
        rows.append(BenchRow("psroipool", case["name"], "backward", name, seconds,
                             tensor_bytes(grad, rois, x), check=verdict, anchor=anchor, anchor_seconds=theirs))
    return rows


def main() -> None:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", default="network", help="cases of cases/psroipool.json with this tag")
    parser.add_argument("--threads", default="1,2", help="torch CPU thread counts, comma-separated")
    for flag, kwargs in (BACKEND, NO_CHECK):
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args()
    limits = MachineLimits.measure("cpu")
    print(limits.describe())
    tv = _torchvision()
    if tv is None:
        print("torchvision does not import here (or has no CPU kernel for this torch): cvops only.")
    counts = [int(t) for t in args.threads.split(",")]
    table = {}
    for threads in counts:
        torch.set_num_threads(threads)
        limits.threads = threads
        for r in run(limits, args.tag, args.backend, args.check):
            table.setdefault((r.case, r.direction), {})[threads] = r
    header = f"{'case':<24} {'dir':<8} " + " ".join(f"{f'{t} thread(s): cvops / tv ms':>30} {'tv/cvops':>8}"
                                                    for t in counts) + "  check"
    print(header)
    for (case, direction), by_threads in table.items():
        cells = []
        for t in counts:
            r = by_threads[t]
            theirs = f"{r.anchor_seconds * 1e3:.3f}" if r.anchor_seconds else "-"
            ratio = f"{r.anchor_seconds / r.seconds:.2f}x" if r.anchor_seconds else "-"
            cells.append(f"{f'{r.seconds * 1e3:.3f} / {theirs}':>30} {ratio:>8}")
        print(f"{case:<24} {direction:<8} " + " ".join(cells) + f"  {by_threads[counts[0]].check}")
    print("tv/cvops: torchvision time / cvops time (>1: cvops faster); *_1roi: one RoI [0, 100, 100, 200, 200].")


if __name__ == "__main__":
    main()
