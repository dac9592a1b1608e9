"""Sparse-conv encoder forward+backward (examples/sparse_encoder.py) on ``cases/sparse_conv.json``, and
spconv 2.x's same network (same weights, same input) in the same run when spconv is installed.

Each timed step builds the kernel maps (get_indice_pairs / spconv's indice generation), runs the
forward through every layer and the backward of ``mean(features**2)``: what one training step of the
middle encoder costs. FLOPs count the GEMMs (2 * pairs * C_in * C_out per layer, x3 for forward and
both gradients); IO is the input features and indices, the parameters, the output features and the
gradients of the inputs and parameters. Each library first runs a step on 256 of the voxels (its kernels
loaded or compiled), then a warm-up step and the timed ones (with ``make demo``'s quick timing a warm-up step
slower than half a second is the measurement).

The check column compares cvops with spconv (output diff1, input-gradient diff2). spconv 2.3.8's CPU
path is not thread-safe: with more than one torch thread its own output changes between thread counts
(diff1 0.41 between its 1- and 2-thread runs of the unit case, measured 2026-11-21), while cvops' sparse
convolutions give the same bits on 1 and 2 threads (each of the quarter case's 13 layers, forward and both
gradients; the encoder's BatchNorm reductions are torch's and do depend on the thread count) and agree with
single-threaded spconv (3.2e-6). Large check values at default threads are spconv's; use ``--threads 1``
for a meaningful check. spconv's single timed step varies a lot on a shared machine (6.2-8.0 s for the
quarter case in one session): for a ratio, compare several runs.

    python benchmarks/bench_sparse_conv.py [--tag network] [--device cpu] [--repeats 1] [--threads N]
"""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch

import cvops
from harness import (NO_ANCHOR, BenchRow, MachineLimits, bench_main, counting_gemm_flops, load_module,
                     module_version, tensor_bytes, time_fn)
from tests.support.anchors import spconv_pytorch
from tests.support.cases import load_cases
from cvops.metrics import diff1, diff2

_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sparse_encoder.py"


def _encoder_module():
    return load_module(_EXAMPLE, "sparse_encoder")


_WARM_UP_ROWS = 256


def run(limits: MachineLimits, tag: str = "network", repeats: int = 1, anchor: bool = True):
    device = limits.device
    enc = _encoder_module()
    spt = spconv_pytorch() if anchor else None
    rows = []
    for case in load_cases("sparse_conv", tag):
        grid, batch = list(case["grid"]), case["batch"]
        features, indices = enc.make_input(case["voxels"], batch, tuple(grid), case["in_channels"])
        features, indices = features.to(device), indices.to(device)
        torch.manual_seed(0)
        net = enc.build_encoder(cvops.sparse, case["in_channels"], case["width"]).to(device).train()
        nets = {"cvops": (net, cvops.sparse)}
        if spt is not None:
            ref = enc.build_encoder(spt, case["in_channels"], case["width"]).to(device).train()
            net.load_state_dict(ref.state_dict())  # spconv 2.x layout: loads unchanged
            nets["spconv"] = (ref, spt)

        results = {}
        gemm_flops = []
        for name, (model, lib) in nets.items():
            leaf = features.clone().requires_grad_()
            last = {}

            def step(model=model, lib=lib, leaf=leaf, rows=None, last=last):
                model.zero_grad(set_to_none=True)
                leaf.grad = None
                x = leaf if rows is None else leaf[:rows].detach().requires_grad_()
                out = model(lib.SparseConvTensor(x, indices[:rows], grid, batch))
                out.features.square().mean().backward()
                last["out"] = out

            # a step on a few hundred voxels loads (or compiles) the kernels the timed steps use, so that with
            # quick timing a slow first full step is a fair measurement of either library
            step(rows=_WARM_UP_ROWS)
            with counting_gemm_flops(model, gemm_flops) if name == "cvops" else nullcontext():
                seconds = time_fn(step, device, repeats=repeats, warmup=1)
            results[name] = (last["out"].dense().detach(), leaf.grad.clone(), model, seconds)
        out_dense, grad_in, model, seconds = results["cvops"]
        params = list(model.parameters())
        out_features = out_dense.permute(0, 2, 3, 4, 1).reshape(-1, out_dense.shape[1])
        out_features = out_features[out_features.abs().sum(1) > 0]  # the active output rows
        io = tensor_bytes(features, indices, params, out_features, grad_in, [p.grad for p in params])
        layers = sum(isinstance(m, cvops.sparse.SparseConvolution) for m in model.modules())
        flops = 3 * sum(gemm_flops[:layers])  # the first step's layers (every step builds the same maps)
        check, anchor_s = "", None
        if "spconv" in results:
            s_dense, s_grad, _, anchor_s = results["spconv"]
            check = f"diff1={diff1(out_dense, s_dense):.1e},dx={diff2(grad_in, s_grad):.1e}"
        backend = "triton" if device.type == "cuda" else "cpu"
        rows.append(BenchRow("sparse_conv", case["name"], "fwd+bwd", backend, seconds, io, flops, check,
                             "spconv " + module_version("spconv") if anchor_s else "", anchor_s))
        del results, nets
    return rows



if __name__ == "__main__":
    bench_main(run, "sparse conv encoder", __doc__,
               (("--repeats", {"dest": "repeats", "type": int, "default": 1}), NO_ANCHOR))
