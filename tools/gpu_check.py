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


# 1. correctness: tools/gpu_check_correctness.py (beside this file, on sys.path when this runs as a script)
from gpu_check_correctness import (DRY_CASES, Checker, check_carafe, check_gradcheck_and_compile,  # noqa: E402
                                   check_indice_pairs, check_masked, check_psamask, check_psroipool,
                                   check_sparse_conv)


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
                _speed_row(report, r, limits)
            report.note(f"speed {op}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s")
        except Exception as exc:  # noqa: BLE001
            report.note(f"speed {op} stopped: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        report.write()
    if not only or "psroipool" in only:
        try:
            for r in torchvision_psroipool(harness, limits, dry):
                _speed_row(report, r, limits)
        except Exception as exc:  # noqa: BLE001
            report.note(f"torchvision ps_roi_pool anchor skipped: {type(exc).__name__}: {exc}")
    torch.cuda.empty_cache() if device.type == "cuda" else None


def _speed_row(report, r, limits) -> None:
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
    from cvops.metrics import diff1
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
        check = f"diff1={diff1(mine, theirs):.1e}"
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
        check = f"diff1={diff1(xa.grad, xb.grad):.1e}"
        ours, anchor = harness.time_pair(lambda: torch.autograd.grad(ya, xa, grad, retain_graph=True),
                                         lambda: torch.autograd.grad(yb, xb, grad, retain_graph=True), device,
                                         repeats=15)
        rows.append(harness.BenchRow("psroipool", f"{case['name']} tv", "backward", "triton", ours,
                                     harness.tensor_bytes(grad, rois, x), 0.0, check, "torchvision CUDA", anchor))
    return rows


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
