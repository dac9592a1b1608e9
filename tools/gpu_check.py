"""One prepared check of every Triton kernel on a real GPU: correctness, then speed against the machine's limits.

    PYTHONPATH=src python3 tools/gpu_check.py --out DIR            # on a machine with an NVIDIA GPU, no install
    PYTHONPATH=src python3 tools/gpu_check.py --out DIR --dry-run  # CPU, Triton's interpreter, tiny cases (CI)

Sections, each written to ``DIR/gpu-check.md`` and ``DIR/gpu-check.json`` as soon as it ends (a run cut short
keeps what it finished):

1. correctness: every op, forward and backward, every dtype it accepts and both layouts, the ``unit`` and
   ``network`` cases of ``cases/<op>.json`` on the device with Triton compiled for real, against the CPU from
   the same data: the loop reference where the case is small, the CPU backend (tested equal to the reference
   in CI) at network scale. Pure-IO results must be bit-equal, accumulating ones within diff1, diff2 <= 3e-3;
   plus ``gradcheck`` on small float64 inputs and one ``torch.compile`` call per op. One line per op and dtype.
2. speed: each op's network cases (the ``benchmarks/bench_<op>.py`` runs) with the device's copy bandwidth and
   matmul rate measured in the same run, and the anchors the machine has: dense ``F.conv2d`` (MaskedConv2d),
   the unfold composite (CARAFE), torchvision's CUDA ``ps_roi_pool`` (R-FCN cases, torchvision convention).
3. a VoxelBackBone8x training step at KITTI scale through ``cvops.spconv``, timed, with the GPU time split into
   kernel maps, gather, GEMM, scatter and other by kernel name (torch profiler).

Whatever a torch or triton version lacks is reported as skipped; the run goes on. Exit status 1 when any
correctness check fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOL = 3e-3


class Report:
    """Rows of every section, rewritten to DIR as markdown and JSON after each section."""

    def __init__(self, out: Path, meta: dict):
        self.out, self.meta = out, meta
        self.sections: dict[str, list[dict]] = {}
        self.notes: list[str] = []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, section: str, row: dict) -> None:
        self.sections.setdefault(section, []).append(row)
        print(f"[{section}] " + "  ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print("NOTE", text, flush=True)

    def failures(self) -> list[dict]:
        return [r for r in self.sections.get("correctness", []) if r.get("ok") is False]

    def write(self) -> None:
        (self.out / "gpu-check.json").write_text(json.dumps(
            {"meta": self.meta, "sections": self.sections, "notes": self.notes}, indent=1, default=str))
        lines = [f"# cvops GPU check, {self.meta['date']}", ""]
        lines += [f"- {k}: {v}" for k, v in self.meta.items() if k != "date"]
        for name, rows in self.sections.items():
            lines += ["", f"## {name}", ""]
            keys = list(dict.fromkeys(k for r in rows for k in r))
            lines += ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
            lines += ["| " + " | ".join(_cell(r.get(k, "")) for k in keys) + " |" for r in rows]
        if self.notes:
            lines += ["", "## notes", ""] + [f"- {n}" for n in self.notes]
        lines += ["", f"correctness failures: {len(self.failures())}"]
        (self.out / "gpu-check.md").write_text("\n".join(lines) + "\n")


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v).replace("|", "/")


def machine_meta(device) -> dict:
    import torch
    meta = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
            "torch": torch.__version__}
    try:
        import triton
        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = "absent"
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
        try:
            meta["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            meta["driver"] = "unknown (nvidia-smi not found)"
        meta["cuda"] = torch.version.cuda
    else:
        meta["gpu"] = "none: dry run on the CPU under TRITON_INTERPRET=1"
    return meta


# ---------------------------------------------------------------------------------------------
# 1. correctness


class Checker:
    """Runs the device backend and the CPU oracle on the same data and compares with the docs' metrics."""

    def __init__(self, report: Report, device, dry: bool):
        import torch
        from cvops._core import metrics
        self.torch, self.metrics, self.report, self.device, self.dry = torch, metrics, report, device, dry
        self.rows: dict[tuple, dict] = {}
        self.dtypes = (torch.float32,)

    def oracle(self, numel: int) -> str:
        """The loop reference where it runs in well under a second, else the CPU backend."""
        return "reference" if numel <= 20_000 else "cpu"

    def compare(self, op: str, dtype, what: str, case: str, actual, expected, exact: bool, oracle: str) -> None:
        key = (op, str(dtype).removeprefix("torch."))
        row = self.rows.setdefault(key, {"op": op, "dtype": key[1], "checks": 0, "worst": 0.0, "ok": True,
                                         "oracles": set(), "failed": []})
        row["checks"] += 1
        row["oracles"].add(oracle)
        actual = actual.detach().cpu()
        if exact:
            same = actual.shape == expected.shape and bool(self.metrics.bit_equal(actual, expected))
            err = 0.0 if same else float("inf")
        elif actual.shape != expected.shape:
            err = float("inf")
        else:
            err = max(self.metrics.diff1(actual, expected), self.metrics.diff2(actual, expected))
            err = err if err == err else float("inf")  # nan
        row["worst"] = max(row["worst"], err)
        if err > (0.0 if exact else TOL):
            row["ok"] = False
            row["failed"].append(f"{case} {what} ({'not bit-equal' if exact else f'diff {err:.1e}'})")

    def error(self, op: str, dtype, case: str, exc: BaseException) -> None:
        key = (op, str(dtype).removeprefix("torch."))
        row = self.rows.setdefault(key, {"op": op, "dtype": key[1], "checks": 0, "worst": 0.0, "ok": True,
                                         "oracles": set(), "failed": []})
        row["ok"] = False
        row["failed"].append(f"{case}: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
        traceback.print_exc()

    def flush(self, op: str) -> None:
        for key in [k for k in self.rows if k[0] == op]:
            row = self.rows.pop(key)
            failed = row.pop("failed")
            row["oracles"] = "+".join(sorted(row["oracles"]))
            row["worst"] = f"{row['worst']:.1e}" if row["worst"] not in (0.0, float("inf")) else str(row["worst"])
            row["failed"] = "; ".join(failed[:4]) + (f" (+{len(failed) - 4} more)" if len(failed) > 4 else "")
            self.report.add("correctness", row)


def _nhwc(t, layout):
    return t.permute(0, 2, 3, 1).contiguous() if layout == "NHWC" else t


# The dry run's cases: small enough for Triton's interpreter, and between them every mode of the op.
DRY_CASES = {"psamask": ("mmcv_test_collect", "odd_mask_small_feature"),
             "carafe": ("scale3_groups3",),
             "masked_im2col": ("mmcv_test_masked_conv2d", "gtest_case0_k4_negative"),
             "psroipool": ("fractional_rois",),
             "get_indice_pairs": ("tiny_subm", "transpose_k3_s2")}


def _cases(op: str, dry: bool, tags=("unit", "network")):
    from tests.support.cases import load_cases
    cases = [c for t in tags for c in load_cases(op, t) if "error" not in c]
    cases = list({c["name"]: c for c in cases}.values())
    return [c for c in cases if c["name"] in DRY_CASES[op]] if dry else cases


def _dtypes(ck, with_double: bool):
    """The dtypes of this pass (float32 first, the others after the speed section) that the op accepts."""
    import torch
    every = (torch.float32, torch.float16, torch.bfloat16) + ((torch.float64,) if with_double else ())
    return [d for d in every if d in ck.dtypes]


def _network_subset(ck, dtype, case, first_network: dict) -> bool:
    """float32 takes every case; the other dtypes the unit cases and the op's first network case."""
    import torch
    if dtype == torch.float32 or "network" not in case["tags"]:
        return True
    return first_network.setdefault(id(ck), case["name"]) == case["name"]


def check_psamask(ck: Checker) -> None:
    import torch
    import cvops
    for dtype in _dtypes(ck, False):
        first: dict = {}
        for case in _cases("psamask", ck.dry):
            if not _network_subset(ck, dtype, case, first):
                continue
            try:
                mask = (case["h_mask"], case["w_mask"])
                n, h, w, mode = case["N"], case["H"], case["W"], case["psa_type"]
                layouts = ("NCHW", "NHWC") if "unit" in case["tags"] else (case["layout"],)
                for layout in layouts:
                    g = torch.Generator().manual_seed(0)
                    for what, fn, c in (("fwd", cvops.psamask_forward, mask[0] * mask[1]),
                                        ("bwd", cvops.psamask_backward, h * w)):
                        x = _nhwc(torch.randn(n, c, h, w, generator=g).to(dtype), layout)
                        oracle = ck.oracle(n * h * w * h * w)
                        got = fn(x.to(ck.device), mode, mask, layout, backend="triton")
                        ck.compare("psamask", dtype, f"{what} {layout}", case["name"], got,
                                   fn(x, mode, mask, layout, backend=oracle), True, oracle)
            except Exception as exc:  # noqa: BLE001 - every failure is a reported row, the run goes on
                ck.error("psamask", dtype, case["name"], exc)
    ck.flush("psamask")


def check_carafe(ck: Checker) -> None:
    import torch
    import cvops
    for dtype in _dtypes(ck, True):
        first: dict = {}
        for case in _cases("carafe", ck.dry):
            if not _network_subset(ck, dtype, case, first):
                continue
            try:
                n, c, h, w = case["N"], case["C"], case["H"], case["W"]
                k, grp, s = case["kernel_size"], case["group_size"], case["scale_factor"]
                g = torch.Generator().manual_seed(0)
                x = torch.randn(n, c, h, w, generator=g)
                m = torch.randn(n, grp, k * k, h * s, w * s, generator=g).softmax(2).view(n, grp * k * k, h * s, w * s)
                gy = torch.randn(n, c, h * s, w * s, generator=g)
                layouts = ("NCHW", "NHWC") if "unit" in case["tags"] else (case.get("layout", "NCHW"),)
                oracle = ck.oracle(gy.numel() * k * k)
                for layout in layouts:
                    xi, mi, gi = (_nhwc(t.to(dtype), layout) for t in (x, m, gy))
                    dev = [t.to(ck.device) for t in (xi, mi, gi)]
                    got = cvops.carafe_forward(dev[0], dev[1], k, grp, s, layout, backend="triton")
                    ck.compare("carafe", dtype, f"fwd {layout}", case["name"], got,
                               cvops.carafe_forward(xi, mi, k, grp, s, layout, backend=oracle), False, oracle)
                    got = cvops.carafe_backward(dev[2], dev[0], dev[1], k, grp, s, layout, backend="triton")
                    ref = cvops.carafe_backward(gi, xi, mi, k, grp, s, layout, backend=oracle)
                    for name, a, b in zip(("grad_input", "grad_mask"), got, ref):
                        ck.compare("carafe", dtype, f"{name} {layout}", case["name"], a, b, False, oracle)
            except Exception as exc:  # noqa: BLE001
                ck.error("carafe", dtype, case["name"], exc)
    ck.flush("carafe")


def check_masked(ck: Checker) -> None:
    import torch
    import cvops
    from tests.support.inputs.masked_im2col import DTYPES, case_inputs, case_mask
    for dtype in _dtypes(ck, True):
        seen, first = set(), {}
        for case in _cases("masked_im2col", ck.dry):
            if not _network_subset(ck, dtype, case, first):
                continue
            try:
                feature, hi, wi, kernel, pad = case_inputs(case)
                feature = feature.to(dtype)
                key = (tuple(case["feature"]), case.get("mask_ratio"), case.get("mask_cnt"), tuple(kernel))
                if key not in seen:  # cases that differ only in out_channels gather the same columns
                    seen.add(key)
                    oracle = ck.oracle(feature.shape[1] * kernel[0] * kernel[1] * hi.numel())
                    dev = [t.to(ck.device) for t in (feature, hi, wi)]
                    cols = cvops.masked_im2col(*dev, kernel, pad, backend="triton")
                    ck.compare("masked_im2col", dtype, "im2col", case["name"], cols,
                               cvops.masked_im2col(feature, hi, wi, kernel, pad, backend=oracle), True, oracle)
                    inside = (hi >= 0) & (hi < feature.shape[2]) & (wi >= 0) & (wi < feature.shape[3])
                    h2, w2 = hi[inside], wi[inside]
                    if len(set(zip(h2.tolist(), w2.tolist()))) == h2.numel():  # col2im needs distinct points
                        col = torch.randn(feature.shape[1], h2.numel(), generator=torch.Generator().manual_seed(1))
                        col = col.to(dtype)
                        args = (feature.shape[2], feature.shape[3])
                        got = cvops.masked_col2im(col.to(ck.device), h2.to(ck.device), w2.to(ck.device), *args,
                                                  backend="triton")
                        ck.compare("masked_im2col", dtype, "col2im", case["name"], got,
                                   cvops.masked_col2im(col, h2, w2, *args, backend=oracle), True, oracle)
                if "out_channels" in case:
                    _check_masked_conv(ck, case, feature, case_mask(case, hi, wi), kernel, pad, dtype)
            except Exception as exc:  # noqa: BLE001
                ck.error("masked_im2col", dtype, case["name"], exc)
    ck.flush("masked_im2col")


def _check_masked_conv(ck, case, feature, mask, kernel, pad, dtype) -> None:
    import torch
    import cvops
    g = torch.Generator().manual_seed(2)
    weight = (torch.randn(case["out_channels"], feature.shape[1], *kernel, generator=g) * 0.05).to(dtype)
    bias = torch.randn(case["out_channels"], generator=g).to(dtype)
    results = []
    for device, backend in ((ck.device, "triton"), (torch.device("cpu"), "cpu")):
        f, wt, b = (t.to(device).requires_grad_() for t in (feature, weight, bias))
        out = cvops.masked_conv2d(f, mask.to(device), wt, b, pad, backend=backend)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
        out.backward(grad.to(device))
        results.append((out, f.grad, wt.grad, b.grad))
    for name, a, b in zip(("conv", "grad_input", "grad_weight", "grad_bias"), *results):
        ck.compare("masked_im2col", dtype, f"MaskedConv2d {name}", case["name"], a, b, False, "cpu")


def check_psroipool(ck: Checker) -> None:
    import torch
    import cvops
    from tests.support.inputs.psroipool import case_input, case_rois
    for dtype in _dtypes(ck, True):
        first: dict = {}
        for case in _cases("psroipool", ck.dry):
            if not _network_subset(ck, dtype, case, first):
                continue
            try:
                ph, pw, scale, grp, od = (case["pooled_height"], case["pooled_width"], case["spatial_scale"],
                                          case["group_size"], case["output_dim"])
                x, rois = case_input(case, dtype), case_rois(case, dtype)
                bottom = tuple(case.get("bottom_shape", case["input_shape"]))
                oracle = ck.oracle(rois.shape[0] * od * x.shape[1] * x.shape[2] // 4)
                layouts = ("NHWC", "NCHW") if "unit" in case["tags"] else ("NHWC",)
                for layout in layouts:
                    xi = x.permute(0, 3, 1, 2).contiguous() if layout == "NCHW" else x
                    out, mapping = cvops.psroi_pool(xi.to(ck.device), rois.to(ck.device), ph, pw, scale, grp, od,
                                                    layout, backend="triton")
                    ref, ref_map = cvops.psroi_pool(xi, rois, ph, pw, scale, grp, od, layout, backend=oracle)
                    ck.compare("psroipool", dtype, f"fwd {layout}", case["name"], out, ref, False, oracle)
                    ck.compare("psroipool", dtype, f"mapping {layout}", case["name"], mapping, ref_map, True, oracle)
                    shape = bottom if layout == "NHWC" else (bottom[0], bottom[3], bottom[1], bottom[2])
                    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
                    got = cvops.psroi_pool_backward(grad.to(ck.device), rois.to(ck.device), ref_map.to(ck.device),
                                                    scale, od, shape, layout, backend="triton")
                    ck.compare("psroipool", dtype, f"bwd {layout}", case["name"], got,
                               cvops.psroi_pool_backward(grad, rois, ref_map, scale, od, shape, layout,
                                                         backend=oracle), False, oracle)
            except Exception as exc:  # noqa: BLE001
                ck.error("psroipool", dtype, case["name"], exc)
    ck.flush("psroipool")


def check_indice_pairs(ck: Checker) -> None:
    import torch
    import cvops
    if torch.float32 not in ck.dtypes:
        return  # integer maps: one pass
    from tests.support.inputs import get_indice_pairs as voxels
    for case in _cases("get_indice_pairs", ck.dry):
        try:
            idx, kw = voxels.case_indices(case), voxels.case_kwargs(case)
            oracle = ck.oracle(idx.shape[0] * 27 * 20)
            got = cvops.get_indice_pairs(idx.to(ck.device), backend="triton", **kw)
            ref = cvops.get_indice_pairs(idx, backend=oracle, **kw)
            for name, a, b in zip(("out_indices", "indice_pairs", "indice_num"), got, ref):
                ck.compare("get_indice_pairs", "int32", name, case["name"], a, b, True, oracle)
        except Exception as exc:  # noqa: BLE001
            ck.error("get_indice_pairs", "int32", case["name"], exc)
    ck.flush("get_indice_pairs")


def check_sparse_conv(ck: Checker) -> None:
    """indice_conv forward and both gradients on subm, strided and inverse maps of LiDAR-like sites."""
    import torch
    import cvops
    from cvops.sparse.functional import indice_conv
    from cvops.sparse.kmap import identity_offset
    from tests.support.inputs.get_indice_pairs import lidar_voxels
    num = 120 if ck.dry else 40_000
    idx = lidar_voxels(num, 2, (41, 400, 352), seed=5)
    maps = {"subm": cvops.get_indice_pairs(idx, 2, [41, 400, 352], 3, 1, 1, 1, subm=True, backend="cpu"),
            "strided": cvops.get_indice_pairs(idx, 2, [41, 400, 352], 3, 2, 1, 1, backend="cpu")}
    for dtype in _dtypes(ck, True):
        for kind, (out_idx, pairs, counts) in maps.items():
            for inverse in (False, True) if kind == "strided" else (False,):
                try:
                    n_in, n_out = (len(out_idx), num) if inverse else (num, len(out_idx))
                    g = torch.Generator().manual_seed(0)
                    feats = torch.randn(n_in, 32, generator=g).to(dtype)
                    weight = (torch.randn(27, 32, 48, generator=g) * 0.1).to(dtype)
                    grad = torch.randn(n_out, 48, generator=g).to(dtype)
                    ident = identity_offset((3, 3, 3), (1, 1, 1), (1, 1, 1)) if kind == "subm" else -1
                    results = []
                    for device, backend in ((ck.device, "triton"), (torch.device("cpu"), "cpu")):
                        f, w = feats.to(device).requires_grad_(), weight.to(device).requires_grad_()
                        y = indice_conv(f, w, pairs.to(device), counts.to(device), n_out, inverse=inverse,
                                        identity_offset=ident, backend=backend)
                        y.backward(grad.to(device))
                        results.append((y, f.grad, w.grad))
                    name = kind + (" inverse" if inverse else "")
                    for what, a, b in zip(("fwd", "grad_features", "grad_weight"), *results):
                        ck.compare("sparse_conv", dtype, f"{name} {what}", f"lidar {num}", a, b, False, "cpu")
                except Exception as exc:  # noqa: BLE001
                    ck.error("sparse_conv", dtype, kind, exc)
    ck.flush("sparse_conv")


def small_float64_calls(device):
    """One small float64 call per op on ``device`` (name, fn, inputs): the gradcheck and compile cases."""
    import torch
    import cvops
    from cvops.sparse.functional import indice_conv
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device).requires_grad_()
    rois = torch.tensor([[0, 1.0, 1.0, 6.0, 7.0], [0, 0.5, 2.0, 8.0, 5.0]], dtype=torch.float64, device=device)
    idx = torch.tensor([[0, 0, 0, 1], [0, 0, 1, 1], [0, 1, 1, 2], [0, 2, 0, 0]], dtype=torch.int32)
    _, pairs, counts = cvops.get_indice_pairs(idx, 1, [3, 3, 3], 3, 1, 1, 1, subm=True, backend="cpu")
    pairs, counts = pairs.to(device), counts.to(device)
    mask = (torch.rand(1, 5, 6, generator=g) > 0.5).float().to(device)
    m = torch.randn(1, 9, 6, 8, generator=g, dtype=torch.float64).softmax(1).to(device).requires_grad_()
    return [
        ("psamask", lambda x: cvops.psamask(x, "collect", (3, 3), backend="triton"), (rand(1, 9, 4, 5),)),
        ("carafe", lambda x, m: cvops.carafe(x, m, 3, 1, 2, backend="triton"), (rand(1, 2, 3, 4), m)),
        ("masked_conv2d", lambda x, w: cvops.masked_conv2d(x, mask, w, None, 1, backend="triton"),
         (rand(1, 2, 5, 6), rand(3, 2, 3, 3))),
        ("psroi_pool", lambda x: cvops.psroi_pool(x, rois, 2, 2, 1.0, 2, 2, "NCHW", backend="triton")[0],
         (rand(1, 8, 9, 9),)),
        ("sparse_conv", lambda f, w: indice_conv(f, w, pairs, counts, 4, inverse=False, identity_offset=13,
                                                 backend="triton"), (rand(4, 3), rand(27, 3, 2))),
    ]


def check_gradcheck_and_compile(report: Report, device, dry: bool) -> None:
    import torch
    for name, fn, inputs in small_float64_calls(device):
        row = {"op": name}
        try:
            # the dry run's interpreter takes seconds per call: fast mode checks random projections only
            ok = torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, fast_mode=dry)
            row["gradcheck"] = "pass" if ok else "FAIL"
        except Exception as exc:  # noqa: BLE001 - gradcheck raises on a mismatch
            row["gradcheck"] = f"FAIL: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        if dry:
            row["compile"] = "skipped (dry run: inductor needs a C compiler per graph, too slow for CI's minute)"
        else:
            try:
                compiled = torch.compile(fn, fullgraph=True)
                same = torch.equal(compiled(*inputs), fn(*inputs))
                row["compile"] = "pass" if same else "FAIL: differs from eager"
            except Exception as exc:  # noqa: BLE001
                row["compile"] = f"FAIL: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        row["ok"] = not (row["gradcheck"].startswith("FAIL") or row["compile"].startswith("FAIL"))
        report.add("correctness", {"op": name, "dtype": "float64", "checks": "gradcheck, compile",
                                   "ok": row["ok"], "failed": "" if row["ok"] else
                                   f"gradcheck {row['gradcheck']}; compile {row['compile']}"})


# ---------------------------------------------------------------------------------------------
# 2. speed


def speed(report: Report, device, dry: bool, only) -> None:
    import torch
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness
    if dry:
        harness.set_quick(True, min_s=0.0, max_s=0.5)
    limits = harness.MachineLimits.measure(device, copy_mib=16 if dry else 1024)
    report.meta["copy bandwidth GB/s"] = round(limits.bandwidth / 1e9, 1)
    report.meta["fp32 matmul TFLOP/s"] = round(limits.matmul_flops / 1e12, 1)
    tag = "unit" if dry else "network"
    backend = "cpu" if dry else None  # the dry run exercises this section's code; the kernels ran in section 1
    benches = {"psamask": {"backend": backend, "check": False}, "masked_im2col": {"backend": backend},
               "carafe": {"backend": backend}, "psroipool": {"backend": backend, "check": False},
               "get_indice_pairs": {"backend": backend, "check": False}, "sparse_conv": {"anchor": False}}
    for op, kwargs in benches.items():
        if only and op not in only:
            continue
        if dry and op == "sparse_conv":
            continue  # section 3 runs the same layers
        try:
            module = harness.load_module(ROOT / "benchmarks" / f"bench_{op}.py")
            if dry:  # one tiny case per op keeps the dry run within CI's minute
                first = [c for c in module.load_cases(op, tag) if c["name"] == DRY_CASES[op][0]]
                module.load_cases = lambda *_a, _first=first: _first
            t0 = time.perf_counter()
            rows = module.run(limits, tag=tag, **kwargs)
            for r in rows:
                _speed_row(report, harness, r, limits)
            report.note(f"speed {op}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s")
        except Exception as exc:  # noqa: BLE001
            report.note(f"speed {op} stopped: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        report.write()
    if not only or "psroipool" in only:
        try:
            for r in torchvision_psroipool(harness, limits, dry):
                _speed_row(report, harness, r, limits)
        except Exception as exc:  # noqa: BLE001
            report.note(f"torchvision ps_roi_pool anchor skipped: {type(exc).__name__}: {exc}")
    torch.cuda.empty_cache() if device.type == "cuda" else None


def _speed_row(report, harness, r, limits) -> None:
    from report import speed as judged  # benchmarks/report.py: the limit each row is judged against
    limit, _ = judged(r, limits)
    report.add("speed", {"op": r.op, "case": r.case, "dir": r.direction, "ms": round(r.seconds * 1e3, 4),
                         "IO MB": round(r.io_bytes / 1e6, 2), "IO eff": f"{r.io_efficiency(limits):.0%}",
                         "roofline": f"{r.roofline_efficiency(limits):.0%}" if r.flops else "-",
                         "judged by": limit, "anchor": r.anchor,
                         "vs anchor": f"{r.anchor_seconds / r.seconds:.2f}x" if r.anchor_seconds else "",
                         "check": r.check})


def torchvision_psroipool(harness, limits, dry: bool):
    """cvops (torchvision convention, NCHW) against torchvision.ops.ps_roi_pool on the R-FCN cases."""
    import torch
    import cvops
    from torchvision.ops import ps_roi_pool
    from tests.support.cases import load_cases
    from tests.support.inputs.psroipool import case_input, case_rois
    device = limits.device
    if device.type != "cuda":
        raise RuntimeError("torchvision's ps_roi_pool anchor is timed on CUDA only")
    rows = []
    for case in load_cases("psroipool", "network")[: 1 if dry else None]:
        ph, scale = case["pooled_height"], case["spatial_scale"]
        x = case_input(case).permute(0, 3, 1, 2).contiguous().to(device)
        rois = case_rois(case).to(device)
        mine = cvops.torchvision.ps_roi_pool(x, rois, ph, scale)
        theirs = ps_roi_pool(x, rois, ph, scale)
        check = f"diff1={harness_diff(mine, theirs):.1e}"
        ours, anchor = harness.time_pair(lambda: cvops.torchvision.ps_roi_pool(x, rois, ph, scale),
                                         lambda: ps_roi_pool(x, rois, ph, scale), device, repeats=15)
        io = harness.tensor_bytes(x, rois, mine)
        rows.append(harness.BenchRow("psroipool", f"{case['name']} tv", "forward", "triton", ours, io, 0.0, check,
                                     "torchvision CUDA", anchor))
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        grad = torch.randn_like(mine)
        ya, yb = cvops.torchvision.ps_roi_pool(xa, rois, ph, scale), ps_roi_pool(xb, rois, ph, scale)
        ya.backward(grad, retain_graph=True)
        yb.backward(grad, retain_graph=True)
        check = f"diff1={harness_diff(xa.grad, xb.grad):.1e}"
        ours, anchor = harness.time_pair(lambda: torch.autograd.grad(ya, xa, grad, retain_graph=True),
                                         lambda: torch.autograd.grad(yb, xb, grad, retain_graph=True), device,
                                         repeats=15)
        rows.append(harness.BenchRow("psroipool", f"{case['name']} tv", "backward", "triton", ours,
                                     harness.tensor_bytes(grad, rois, x), 0.0, check, "torchvision CUDA", anchor))
    return rows


def harness_diff(a, b) -> float:
    from cvops._core.metrics import diff1
    return diff1(a, b)


# ---------------------------------------------------------------------------------------------
# 3. a sparse backbone training step

# Kernel (CUDA) or op (CPU dry run) names by phase, matched in this order; the CPU's sparse conv op gathers,
# multiplies and scatters inside one call, so only its maps and torch's GEMM ops are told apart there.
PHASES = (("maps", ("slot_key", "subm_probe", "pack_pairs", "sort", "unique", "radix", "scan", "indice_pairs")),
          ("gather", ("gather_rows",)), ("scatter", ("scatter_add_rows",)),
          ("GEMM", ("gemm", "xmma", "cutlass", "nvjet", "sm90", "sm80", "dot", "aten::mm", "aten::addmm")))


def backbone_step(report: Report, device, dry: bool) -> None:
    import torch
    import cvops.spconv as cvspconv
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness
    bb = harness.load_module(ROOT / "tests" / "ops" / "_spconv_backbones.py", "_spconv_backbones")
    grid, per_frame = ((41, 100, 88), 500) if dry else ((41, 1600, 1408), 16000)
    features, indices = bb.lidar_input(per_frame * 2, 2, grid, seed=0)
    features, indices = features.to(device), indices.to(device)
    torch.manual_seed(0)
    net = bb.VoxelBackBone8x(cvspconv).to(device).train()

    def step():
        net.zero_grad(set_to_none=True)
        leaf = features.clone().requires_grad_()
        out = net(cvspconv.SparseConvTensor(leaf, indices, list(grid), 2))
        (out.features.float() ** 2).mean().backward()

    step()
    seconds = harness.time_fn(step, device, repeats=1 if dry else 5, warmup=1)
    row = {"net": "VoxelBackBone8x", "grid": "x".join(map(str, grid)), "voxels": per_frame * 2,
           "ms per step": round(seconds * 1e3, 2)}
    try:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
        with profile(activities=activities) as prof:
            step()
            harness.synchronize(device)
        shares = {name: 0.0 for name, _ in PHASES}
        shares["other"] = 0.0
        attr = "device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        for event in prof.key_averages():
            if device.type == "cuda" and getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
                continue
            spent = getattr(event, attr, 0.0) or getattr(event, "cuda_time_total", 0.0)
            lowered = event.key.lower()
            phase = next((n for n, keys in PHASES if any(k in lowered for k in keys)), "other")
            shares[phase] += spent
        total = sum(shares.values()) or 1.0
        row["GPU kernel ms" if device.type == "cuda" else "CPU op ms"] = round(total / 1e3, 2)
        row.update({f"{k} share": f"{v / total:.0%}" for k, v in shares.items()})
    except Exception as exc:  # noqa: BLE001
        row["breakdown"] = f"skipped: {type(exc).__name__}: {exc}"
    report.add("sparse backbone step", row)


# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-check-out")
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny cases")
    parser.add_argument("--only", default="", help="comma-separated ops (psamask,carafe,masked_im2col,...)")
    parser.add_argument("--skip", default="", help="sections to skip: correctness,speed,backbone")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("CVOPS_NUMBA", "0")  # the CPU oracle: the plain torch path needs no compile
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    import torch
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on a machine without a GPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    report = Report(args.out, machine_meta(device))
    only = {s for s in args.only.split(",") if s}
    skip = {s for s in args.skip.split(",") if s}
    t_start = time.perf_counter()
    ck = Checker(report, device, args.dry_run)

    def correctness(dtypes):
        ck.dtypes = dtypes
        for op, check in (("psamask", check_psamask), ("masked_im2col", check_masked),
                          ("psroipool", check_psroipool), ("carafe", check_carafe),
                          ("get_indice_pairs", check_indice_pairs), ("sparse_conv", check_sparse_conv)):
            if not only or op in only:
                t0 = time.perf_counter()
                check(ck)
                report.note(f"correctness {op} {'/'.join(str(d)[6:] for d in dtypes)}: "
                            f"{time.perf_counter() - t0:.1f} s")
                report.write()

    # float32 first, then gradcheck and compile, speed and the backbone; the other dtypes last, so that a
    # run cut short still has one result of every kind
    if "correctness" not in skip:
        correctness((torch.float32,))
        if not only or "gradcheck" in only:
            t0 = time.perf_counter()
            check_gradcheck_and_compile(report, device, args.dry_run)
            report.note(f"gradcheck and compile: {time.perf_counter() - t0:.1f} s")
        report.write()
    if "speed" not in skip:
        speed(report, device, args.dry_run, only)
        report.write()
    if "backbone" not in skip and (not only or "backbone" in only):
        try:
            backbone_step(report, device, args.dry_run)
        except Exception as exc:  # noqa: BLE001
            report.note(f"backbone step stopped: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    if "correctness" not in skip and not args.dry_run:
        correctness((torch.float16, torch.bfloat16, torch.float64))
    report.note(f"total {time.perf_counter() - t_start:.0f} s")
    report.write()
    failures = report.failures()
    print(f"\n{len(failures)} correctness failure(s); results in {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
