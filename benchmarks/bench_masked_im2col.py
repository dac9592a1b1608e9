"""masked_im2col and MaskedConv2d on the network-scale cases of ``cases/masked_im2col.json``.

Rows:
* ``masked_im2col`` forward: IO = feature + both index tensors + data_col (MLU-OPS default).
  Anchor: the dense torch route, ``F.unfold`` of the whole map then picking the mask columns.
* ``MaskedConv2d`` forward (cases with ``out_channels``): IO = input + mask + weight + bias +
  output, FLOPs = 2*O*C*kh*kw*M. Anchor: the dense ``F.conv2d`` of the same layer (without autograd
  masked_conv2d picks the cheapest of its CPU routes, that one among them: ``ops/masked_im2col/route.py``).
  Cases that differ only in ``out_channels`` share one masked_im2col row.

    python benchmarks/bench_masked_im2col.py [--tag network] [--backend cpu] [--threads 1]

``--threads 1`` gives stable figures on a shared machine: bandwidth and matmul peak are then
measured with the same single thread, so the efficiencies stay comparable.
"""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F

import cvops
from harness import BACKEND, BenchRow, MachineLimits, bench_main, tensor_bytes, time_fn, time_pair
from tests.support.cases import load_cases
from cvops.metrics import bit_equal, diff1
from cvops.ops.masked_im2col import reference
from tests.support.inputs.masked_im2col import case_inputs, case_mask


def _exact_on_sample(data_col, feature, h, w, kernel, pad) -> str:
    pick = torch.linspace(0, h.shape[0] - 1, min(64, h.shape[0]), device=h.device).long().unique()
    ref = reference.im2col_forward(feature, h[pick], w[pick], *kernel, *pad)
    return "exact" if bit_equal(data_col[:, pick], ref) else "MISMATCH"


def run(limits: MachineLimits, tag: str = "network", backend: str | None = None) -> list[BenchRow]:
    device = limits.device
    name = backend or ("triton" if device.type == "cuda" else "cpu")
    rows = []
    gathered = set()  # cases that differ only in out_channels gather the same columns: one row
    for case in load_cases("masked_im2col", tag):
        feature, h, w, kernel, pad = case_inputs(case, device=device)
        _, channels, height, width = feature.shape
        data_col = cvops.masked_im2col(feature, h, w, kernel, pad, backend=backend)
        key = json.dumps({k: v for k, v in case.items() if k not in ("name", "source", "out_channels")}, sort_keys=True)
        if key in gathered:
            _conv_row(rows, case, feature, h, w, kernel, pad, backend, name, device)
            continue
        gathered.add(key)
        t = time_fn(lambda: cvops.masked_im2col(feature, h, w, kernel, pad, backend=backend), device, repeats=15,
                    min_total_s=0.2)
        hl, wl = h.long(), w.long()

        def unfold_pick():
            cols = F.unfold(feature, kernel, padding=pad)  # [1, C*kh*kw, H'*W'] (in-range points only)
            return cols[0][:, hl * (width + 2 * pad[1] - kernel[1] + 1) + wl]

        t_anchor = time_fn(unfold_pick, device, repeats=5)
        rows.append(BenchRow("masked_im2col", case["name"], "forward", name, t,
                             tensor_bytes(feature, h, w, data_col),
                             check=_exact_on_sample(data_col, feature, h, w, kernel, pad),
                             anchor="F.unfold+pick", anchor_seconds=t_anchor))
        _conv_row(rows, case, feature, h, w, kernel, pad, backend, name, device)
    return rows


def _conv_row(rows, case, feature, h, w, kernel, pad, backend, name, device):
    """The MaskedConv2d row of ``case`` (if it has ``out_channels``), against the dense conv2d."""
    if "out_channels" not in case:
        return
    _, channels, height, width = feature.shape
    mask = case_mask(case, h, w)
    conv = cvops.nn.MaskedConv2d(channels, case["out_channels"], kernel, padding=pad).to(device)
    weight, bias = conv.weight.detach(), conv.bias.detach()
    with torch.no_grad():
        out = cvops.masked_conv2d(feature, mask, weight, bias, pad, backend=backend)
        dense = F.conv2d(feature, weight, bias, padding=pad) * (mask > 0)
        t_masked, t_dense = time_pair(lambda: cvops.masked_conv2d(feature, mask, weight, bias, pad, backend=backend),
                                      lambda: F.conv2d(feature, weight, bias, padding=pad), device,
                                      repeats=9, min_total_s=0.4)
    m = int((mask > 0).sum())
    ratio = f"{m / (height * width):.0%} masked"
    rows.append(BenchRow("MaskedConv2d", f"{case['name']} ({ratio})", "forward", name, t_masked,
                         tensor_bytes(feature, mask, weight, bias, out),
                         flops=2.0 * case["out_channels"] * channels * kernel[0] * kernel[1] * m,
                         check=f"diff1={diff1(out, dense):.1e}", anchor="dense F.conv2d",
                         anchor_seconds=t_dense))


if __name__ == "__main__":
    bench_main(run, "masked_im2col / MaskedConv2d", __doc__, (BACKEND,))
