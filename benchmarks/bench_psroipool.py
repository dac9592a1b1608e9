"""psroipool forward and backward on the cases of ``cases/psroipool.json`` (default: R-FCN ResNet-101 at 600x1000,
cls/bbox branches and the COCO cls branch, 128/300/2000 RoIs), plus one small RoI on the cls map (the fixed cost of
a call). Times are medians of repeated calls (``harness.time_fn``), as in every other benchmark.

    python benchmarks/bench_psroipool.py [--tag network] [--backend cpu] [--no-check]

IO bytes (MLU-OPS): forward = input + rois + output + mapping_channel; backward = top_grad + rois +
mapping_channel + bottom_grad. FLOPs (the MLU gtest count): 7 per summed element + 1 per division.
No anchor on CPU: torchvision's ps_roi_pool has no CPU build here (and a different convention).
"""
from __future__ import annotations

import torch

import cvops
from harness import BACKEND, NO_CHECK, BenchRow, MachineLimits, bench_main, tensor_bytes, time_fn
from tests.support.cases import load_cases
from cvops.metrics import diff1, diff2
from tests.support.inputs.psroipool import case_input, case_rois
from cvops.ops.psroipool.cpu import bin_edges


def theory_flops(rois, case) -> float:
    ph, pw, od = case["pooled_height"], case["pooled_width"], case["output_dim"]
    _, h, w, _ = case["input_shape"]
    hs, he, ws, we, _ = bin_edges(rois.cpu(), ph, pw, case["spatial_scale"], h, w, torch.float32)
    area = (he - hs)[:, :, None] * (we - ws)[:, None, :]
    return float(od * (7 * area.sum() + area.numel()))


def _verdict(actual, expected) -> str:
    d1, d2 = diff1(actual, expected), diff2(actual, expected)
    return f"diff1={d1:.1e}" + ("" if max(d1, d2) <= 3e-3 else " FAIL")


def run(limits: MachineLimits, tag: str = "network", backend: str | None = None, check: bool = True):
    device = limits.device
    name = backend or ("triton" if device.type == "cuda" else "cpu")
    rows = []
    cases = load_cases("psroipool", tag)
    for case in cases:
        if "error" in case:
            continue
        ph, pw, scale, group, od = (case["pooled_height"], case["pooled_width"], case["spatial_scale"],
                                    case["group_size"], case["output_dim"])
        x = case_input(case).to(device)
        rois = case_rois(case).to(device)
        flops = theory_flops(rois, case)

        def fwd():
            return cvops.psroi_pool(x, rois, ph, pw, scale, group, od, "NHWC", backend=backend)
        out, mapping = fwd()
        pick = torch.arange(0, len(rois), max(len(rois) // 16, 1), device=device)
        verdict = ""
        if check:  # the loop reference on a subsample of the RoIs
            ref, _ = cvops.psroi_pool(x.cpu(), rois[pick].cpu(), ph, pw, scale, group, od, "NHWC",
                                      backend="reference")
            verdict = _verdict(out[pick].cpu(), ref)
        seconds = time_fn(fwd, device, repeats=15)
        rows.append(BenchRow("psroipool", case["name"], "forward", name, seconds,
                             tensor_bytes(x, rois, out, mapping), flops=flops, check=verdict))

        if case is cases[0]:  # one small RoI on the first case's map: the fixed cost of a call
            one = torch.tensor([[0.0, 100, 100, 200, 200]], device=device)
            rows.append(BenchRow("psroipool", f"{case['name']}_1roi", "forward", name, time_fn(
                lambda: cvops.psroi_pool(x, one, ph, pw, scale, group, od, "NHWC", backend=backend), device,
                repeats=50),
                tensor_bytes(one) + 2 * od * ph * pw * 4))  # IO: what one RoI needs (rois + outputs)
        bottom_shape = tuple(case.get("bottom_shape", case["input_shape"]))
        grad = torch.randn(out.shape, device=device)

        def bwd():
            return cvops.psroi_pool_backward(grad, rois, mapping, scale, od, bottom_shape, "NHWC", backend=backend)
        bottom = bwd()
        verdict = ""
        if check:
            ref = cvops.psroi_pool_backward(grad[pick].cpu(), rois[pick].cpu(), mapping[pick].cpu(), scale, od,
                                            bottom_shape, "NHWC", backend="reference")
            mine = cvops.psroi_pool_backward(grad[pick], rois[pick], mapping[pick], scale, od, bottom_shape, "NHWC",
                                             backend=backend)
            verdict = _verdict(mine.cpu(), ref)
        seconds = time_fn(bwd, device, repeats=15)
        rows.append(BenchRow("psroipool", case["name"], "backward", name, seconds,
                             tensor_bytes(grad, rois, mapping, bottom), flops=flops, check=verdict))
    return rows


if __name__ == "__main__":
    bench_main(run, "psroipool", __doc__, (BACKEND, NO_CHECK))
