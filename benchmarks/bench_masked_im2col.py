"""masked_im2col and MaskedConv2d on the network-scale cases of ``cases/masked_im2col.json``, and MaskedConv2d on
GA-RetinaNet's pyramid levels against the dense ``nn.Conv2d`` with the same weights.

Rows:
* ``masked_im2col`` forward: IO = feature + both index tensors + data_col (MLU-OPS default).
  Anchor: the dense torch route, ``F.unfold`` of the whole map then picking the mask columns.
* ``MaskedConv2d`` forward (cases with ``out_channels``): IO = input + mask + weight + bias +
  output, FLOPs = 2*O*C*kh*kw*M. Anchor: the dense ``F.conv2d`` of the same layer.
  Cases that differ only in ``out_channels`` share one masked_im2col row.
* ``MaskedConv2d`` GA-RetinaNet (``--tag network``, no ``--backend``): the head's two masked convolutions
  (mmdet ``ga_retina_head``: ``retina_cls`` 256 -> 80 and ``retina_reg`` 256 -> 4, 3x3, padding 1) on P3-P7
  of an 800x1333 image (strides 8-128: 100x167 down to 7x11), 10% and 30% of the positions masked, forward
  (no_grad) and forward+backward (input, weight and bias gradients), at 1 thread and at torch's default
  count. Batch 1, as the network runs them: mmcv's op takes one image and mmdet masks with image 0's
  location map. The anchor is ``nn.Conv2d`` with the same weights on the same input. 'vs anchor' is dense
  time / masked time. ``ops/masked_im2col/route.py`` says which route each call takes.

    python benchmarks/bench_masked_im2col.py [--tag network] [--backend cpu] [--threads N]

The caption gives the machine's copy bandwidth and matmul rate, measured at the start with torch's default
thread count (or ``--threads``).
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
    if tag == "network" and backend is None:  # the module has no backend argument: it takes the default
        rows += _ga_retinanet_rows(device, name)
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


# GA-RetinaNet's levels for an 800x1333 image: strides 8, 16, 32, 64, 128
GA_LEVELS = {"P3": (100, 167), "P4": (50, 84), "P5": (25, 42), "P6": (13, 21), "P7": (7, 11)}
GA_HEADS, GA_CHANNELS, GA_MASKED = {"cls": 80, "reg": 4}, 256, (0.1, 0.3)


def _ga_retinanet_rows(device, name):
    """MaskedConv2d against nn.Conv2d with the same weights, forward and forward+backward, per level, head and
    masked share, on the CPU at 1 thread and at torch's default count."""
    threads = torch.get_num_threads()
    counts = (1, threads) if threads > 1 and device.type == "cpu" else (threads,)
    gen = torch.Generator().manual_seed(0)
    channels, rows = GA_CHANNELS, []
    for level, (height, width) in GA_LEVELS.items():
        x = torch.randn(1, channels, height, width, generator=gen).to(device)
        leaf = x.clone().requires_grad_()
        for head, out_channels in GA_HEADS.items():
            masked = cvops.nn.MaskedConv2d(channels, out_channels, 3, padding=1).to(device)
            dense = torch.nn.Conv2d(channels, out_channels, 3, padding=1).to(device)
            dense.load_state_dict(masked.state_dict())
            grad = torch.randn(1, out_channels, height, width, generator=gen).to(device)
            for share in GA_MASKED:
                mask = (torch.rand(1, height, width, generator=gen) < share).float().to(device)

                @torch.no_grad()
                def forward_masked():
                    return masked(x, mask)

                @torch.no_grad()
                def forward_dense():
                    return dense(x)

                def step_masked():
                    masked.zero_grad(set_to_none=True)
                    leaf.grad = None
                    masked(leaf, mask).backward(grad)
                    return [leaf.grad, masked.weight.grad, masked.bias.grad]

                def step_dense():
                    dense.zero_grad(set_to_none=True)
                    leaf.grad = None
                    dense(leaf).backward(grad)

                # the checks: dense conv times the mask, and its gradients
                out = forward_masked()
                check_forward = f"diff1={diff1(out, forward_dense() * mask):.1e}"
                mine = step_masked()
                want = torch.autograd.grad(dense(leaf) * mask, [leaf, dense.weight, dense.bias], grad)
                check_backward = f"diff1={max(diff1(a, b) for a, b in zip(mine, want)):.1e}"
                flops = 2.0 * out_channels * channels * 9 * int(mask.sum())
                io = tensor_bytes(x, mask, masked.weight, masked.bias, out)
                io_step = io + tensor_bytes(grad, mine)  # the output's gradient in, the three gradients out
                case = f"GA-RetinaNet {level} {height}x{width} {head} {channels}->{out_channels} ({share:.0%} masked)"
                for count in counts:
                    torch.set_num_threads(count)
                    try:
                        timed = [time_pair(forward_masked, forward_dense, device, repeats=5, min_total_s=0.5),
                                 time_pair(step_masked, step_dense, device, repeats=5, min_total_s=0.5)]
                    finally:
                        torch.set_num_threads(threads)
                    label = f"{name} ({count} thr)" if device.type == "cpu" else name
                    for direction, (t_masked, t_dense), check, io_bytes, scale in zip(
                            ("forward", "fwd+bwd"), timed, (check_forward, check_backward), (io, io_step), (1, 3)):
                        rows.append(BenchRow("MaskedConv2d", case, direction, label, t_masked, io_bytes,
                                             flops=scale * flops, check=check, anchor="nn.Conv2d",
                                             anchor_seconds=t_dense))
    return rows


if __name__ == "__main__":
    bench_main(run, "masked_im2col / MaskedConv2d", __doc__, (BACKEND,))
