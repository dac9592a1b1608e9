"""get_indice_pairs on the cases of ``cases/get_indice_pairs.json`` (default: the doc's CenterPoint cases),
timed against spconv 2.x's ``spconv.pytorch.ops.get_indice_pairs`` on the same input when spconv is
installed (``pip install spconv``, the CPU build works).

    python benchmarks/bench_get_indice_pairs.py [--tag network] [--backend cpu] [--threads N]

The check column compares the kernel map with spconv's: the same output sites and, per kernel offset,
the same set of (input row, output site) pairs (spconv fills only the first K // 2 offsets for subm).
"""
from __future__ import annotations


import torch

import cvops
from harness import BACKEND, BenchRow, MachineLimits, bench_main, tensor_bytes, time_fn
from tests.support.cases import load_cases
from tests.support.inputs import get_indice_pairs as voxels


def _spconv():
    try:
        import spconv.pytorch as spconv_torch
        from spconv.pytorch import ops
    except Exception:  # not installed, or a build that does not load here
        return None
    return lambda idx, kw: ops.get_indice_pairs(
        idx, kw["batch_size"], list(kw["spatial_shape"]), spconv_torch.ConvAlgo.Native, *kw["lists"],
        kw.get("subm", False), kw.get("transpose", False))


def _lists(kw, ndim):
    def as_list(v):
        return list(v) if isinstance(v, (list, tuple)) else [v] * ndim
    return [as_list(kw.get(name, default)) for name, default in
            (("kernel_size", 3), ("stride", 1), ("padding", 0), ("dilation", 1), ("out_padding", 0))]


def _site_keys(rows: torch.Tensor, shape) -> torch.Tensor:
    key = rows[:, 0].long()
    for c, size in enumerate(shape):
        key = key * size + rows[:, c + 1].long()
    return key


def compare_with_spconv(ours, theirs, out_shape, subm: bool) -> str:
    out, pairs, num = ours
    s_out, s_pairs, s_num = theirs            # spconv: pairs [2, K, L]
    keys, s_keys = _site_keys(out, out_shape), _site_keys(s_out, out_shape)
    if not torch.equal(keys.sort().values, s_keys.sort().values):
        return "sites differ"
    K = num.shape[0]
    span = int(max(keys.max(), s_keys.max())) + 1 if keys.numel() else 1
    for k in range(K // 2 if subm else K):
        n, sn = int(num[k]), int(s_num[k])
        if n != sn:
            return f"indice_num[{k}] differs"
        a = pairs[k, 0, :n].long() * span + keys[pairs[k, 1, :n].long()]
        b = s_pairs[0, k, :sn].long() * span + s_keys[s_pairs[1, k, :sn].long()]
        if not torch.equal(a.sort().values, b.sort().values):
            return f"pairs of offset {k} differ"
    return "pairs=spconv"


def run(limits: MachineLimits, tag: str = "network", backend: str | None = None, check: bool = True):
    device = limits.device
    anchor = _spconv() if device.type == "cpu" else None
    rows = []
    for case in load_cases("get_indice_pairs", tag):
        idx = voxels.case_indices(case).to(device)
        kw = voxels.case_kwargs(case)
        fn = lambda: cvops.get_indice_pairs(idx, **kw, backend=backend)  # noqa: E731
        result = fn()
        seconds = time_fn(fn, device, repeats=5)
        anchor_seconds, verdict = None, ""
        if anchor is not None:
            spkw = dict(kw, lists=_lists(kw, len(kw["spatial_shape"])))
            theirs = anchor(idx, spkw)
            anchor_seconds = time_fn(lambda: anchor(idx, spkw), device, repeats=5)
            if check:
                out_shape = kw["spatial_shape"] if kw.get("subm") else cvops.get_conv_output_size(
                    kw["spatial_shape"], *_lists(kw, len(kw["spatial_shape"]))[:4])
                verdict = compare_with_spconv(result, theirs, out_shape, kw.get("subm", False))
        name = backend or ("triton" if device.type == "cuda" else "cpu")
        rows.append(BenchRow("get_indice_pairs", case["name"], "forward", name, seconds,
                             tensor_bytes(idx, result), check=verdict,
                             anchor="spconv 2.x" if anchor_seconds else "", anchor_seconds=anchor_seconds))
    return rows


if __name__ == "__main__":
    bench_main(run, "get_indice_pairs", __doc__, (BACKEND,))
