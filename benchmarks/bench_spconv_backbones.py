"""Detection backbones through ``cvops.spconv`` against spconv 2.x in the same run: one training step
(forward, including every kernel map, and the backward of a fixed weighted sum of the outputs).

Networks: SECOND's VoxelBackBone8x (default), VoxelResBackBone8x, PartA2's UNetV2 and mmdet3d's
SparseEncoder, written against the spconv API in tests/ops/_spconv_backbones.py and built from one
library or the other with the same weights (spconv's state_dict loaded unchanged). Tags: ``network`` is
KITTI scale (grid 1408 x 1600 x 40 as [41, 1600, 1408] zyx, 16k LiDAR-like voxels per frame, batch 2),
``unit`` a small grid for a quick look.

Each library runs at 1 thread and at torch's thread count: one row per count, cvops against spconv at 1 thread
and against spconv's faster of the two counts among those whose outputs are right. Every timed step's output of
either library is compared with cvops's 1-thread output: a count whose outputs stray beyond the suite's
tolerance (diff1 3e-3) is named in the check column and is not spconv's best (spconv 2.3.8's CPU convolution
gives different, wrong features from call to call on more than one thread; cvops gives the same bits on any
count, so only torch's BatchNorm statistics move its outputs, by about 1e-5),
with cvops's CPU time split into kernel maps, convolution forward, convolution backward and the rest, and the
time its convolutions' matrix products alone would take at the machine's matmul rate at that thread count (the
GEMM floor: the convolutions' time above it is their gathers, scatter-adds and dispatch). The check column
compares the outputs of cvops and 1-thread spconv (diff1). Peak memory
is the largest resident-set growth seen while one step runs (sampled every millisecond), measured for each
library and thread count in a fresh process after a warm-up step (in one long process a step's growth depends
on what ran before it), with glibc's mmap threshold fixed at 128 KiB (``MALLOC_MMAP_THRESHOLD_``): every
larger block goes back to the system when freed, so the reading is the memory the step holds, the same in
every process, not what glibc's adaptive threshold happens to keep.

    python benchmarks/bench_spconv_backbones.py [--tag network] [--nets VoxelBackBone8x,UNetV2] [--repeats 3]

(default: all four nets)
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

import cvops
import cvops.spconv as cvspconv
from harness import (NO_ANCHOR, BenchRow, MachineLimits, bench_main, counting_gemm_flops, load_module,
                     matmul_rate, module_version, tensor_bytes, time_fn)
from cvops.metrics import diff1
from report import TOLERANCE  # a right output's diff1 bound against the reference
from tests.support.anchors import spconv_pytorch

_BACKBONES = Path(__file__).resolve().parents[1] / "tests" / "ops" / "_spconv_backbones.py"
CASES = {"network": ((41, 1600, 1408), 16000, 2), "unit": ((41, 200, 176), 3000, 2)}
CASES_NETS = ("VoxelBackBone8x", "VoxelResBackBone8x", "UNetV2", "SparseEncoder")


def _backbones():
    return load_module(_BACKBONES, "_spconv_backbones")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _release_idle_memory() -> None:
    """glibc's free lists back to the system (cvops.empty_cache, then malloc_trim directly where cvops does
    not find it), so growth is measured from a clean baseline for both libraries."""
    cvops.empty_cache()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def peak_rss_growth(fn) -> int:
    """Largest resident-set growth (bytes) while ``fn()`` runs, sampled every millisecond."""
    _release_idle_memory()
    base, peak, done = _rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss() - base)
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(peak[0], _rss() - base)


PEAK_MMAP_THRESHOLD = 128 << 10  # glibc's own initial threshold, held fixed (see the module docstring)


def peak_in_fresh_process(lib_name: str, net: str, threads: int, tag: str) -> int:
    """:func:`peak_rss_growth` of one step of ``net`` built from ``lib_name`` (``cvops`` or ``spconv``) at
    ``threads`` torch threads, in a new Python process (:func:`_peak_main`) after one warm-up step, with glibc's
    mmap threshold fixed."""
    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(here), str(here.parent),
                                                                    os.environ.get("PYTHONPATH")))),
               MALLOC_MMAP_THRESHOLD_=str(PEAK_MMAP_THRESHOLD))
    done = subprocess.run([sys.executable, __file__, "--peak-of", lib_name, net, str(threads), tag], env=env,
                          capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


def _peak_main(lib_name: str, net: str, threads: str, tag: str) -> None:
    """The fresh process of :func:`peak_in_fresh_process`: prints the peak growth in bytes."""
    torch.set_num_threads(int(threads))
    lib = cvspconv if lib_name == "cvops" else spconv_pytorch()
    bb = _backbones()
    grid, per_frame, batch = CASES[tag]
    features, indices = bb.lidar_input(per_frame * batch, batch, grid, seed=0)
    torch.manual_seed(0)
    step = _step(bb.BACKBONES[net](lib).train(), lib, features, indices, grid, batch)
    step()
    print(peak_rss_growth(step))


def _step(model, lib, features, indices, grid, batch):
    """One training step of ``model``: forward from a fresh leaf of ``features``, backward of :func:`_loss`."""
    def step():
        model.zero_grad(set_to_none=True)
        leaf = features.clone().requires_grad_()
        outs = model(lib.SparseConvTensor(leaf, indices, list(grid), batch))
        _loss(outs).backward()
        return outs
    return step


def _loss(outs):
    total = 0
    for o in outs if isinstance(outs, tuple) else (outs,):
        if isinstance(o, torch.Tensor):
            f, key = o.reshape(o.shape[0], -1), torch.arange(o[0].numel(), dtype=o.dtype)[None]
        else:
            k = o.indices.long()
            key = (((k[:, 0] * 4096 + k[:, 1]) * 4096 + k[:, 2]) * 4096 + k[:, 3]).to(o.features.dtype)[:, None]
            f = o.features
        total = total + (f * torch.sin(0.37 * key + 0.7 * torch.arange(f.shape[1], dtype=f.dtype))).sum()
    return total


def _first_output(outs):
    """The first output's values, kept cheaply inside a timed step (no dense copy): a tensor, or the features,
    indices, shape and batch size of a sparse tensor; :func:`_as_dense` makes them dense afterwards."""
    o = outs[0] if isinstance(outs, tuple) else outs
    return o.detach() if isinstance(o, torch.Tensor) else (o.features.detach(), o.indices, o.spatial_shape, o.batch_size)


def _as_dense(kept) -> torch.Tensor:
    if isinstance(kept, torch.Tensor):
        return kept
    features, indices, shape, batch = kept
    return cvspconv.SparseConvTensor(features, indices, list(shape), batch).dense()


# cvops's step split by the profiler's op names: each op's CPU time with what runs inside it, the rest "other"
PHASES = {"cvops::get_indice_pairs": "maps", "cvops::sparse_indice_conv": "conv fwd",
          "cvops::sparse_indice_conv_backward": "conv bwd"}


def phase_split(step) -> str:
    """``maps 9%, conv fwd 20%, conv bwd 47%, other 24%``: where one cvops step spends its CPU time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    spent = dict.fromkeys(PHASES.values(), 0.0)
    for e in events:
        if e.key in PHASES:
            spent[PHASES[e.key]] += e.cpu_time_total
    spent["other"] = max(0.0, total - sum(spent.values()))
    return ", ".join(f"{name} {v / total:.0%}" for name, v in spent.items())


def gemm_flops(model, step) -> float:
    """The matrix-product FLOPs of one ``step`` of ``model``: each sparse conv's forward products, three times
    over (forward, input gradient, weight gradient)."""
    total = []
    with counting_gemm_flops(model, total):
        step()
    return 3.0 * sum(total)


def matmul_rate_at(threads: int) -> float:
    """The machine's fp32 matmul FLOP/s at ``threads`` torch threads (the GEMM floor's rate)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return matmul_rate(torch.device("cpu"))
    finally:
        torch.set_num_threads(saved)


def run(limits: MachineLimits, tag: str = "network", repeats: int = 3, anchor: bool = True,
        nets: str = ",".join(CASES_NETS)):
    """Per net, one row per torch thread count (1 and the default): cvops's step time, against spconv at the
    same count (1 thread) or spconv's faster of 1 and the default among those whose outputs are right (the
    default count's row)."""
    device = limits.device
    bb = _backbones()
    spt = spconv_pytorch() if anchor else None
    grid, per_frame, batch = CASES[tag]
    features, indices = bb.lidar_input(per_frame * batch, batch, grid, seed=0)
    features, indices = features.to(device), indices.to(device)
    threads = torch.get_num_threads()
    counts = (1, threads) if threads > 1 else (threads,)
    rates = {t: matmul_rate_at(t) for t in counts} if device.type == "cpu" else {}
    rows = []
    for name in nets.split(","):
        torch.manual_seed(0)
        net = bb.BACKBONES[name](cvspconv).to(device).train()
        models = {"cvops": (net, cvspconv)}
        if spt is not None:
            ref = bb.BACKBONES[name](spt).to(device).train()
            net.load_state_dict(ref.state_dict())
            models["spconv"] = (ref, spt)
        results = {}
        for lib_name, (model, lib) in models.items():
            step = _step(model, lib, features, indices, grid, batch)
            for t in counts:
                torch.set_num_threads(t)
                try:
                    kept = [_first_output(step())]  # warm-up (numba compiles, caches fill)
                    if t == 1 or lib_name == "cvops":
                        results.setdefault(f"{lib_name}_out", _as_dense(kept[0]))
                    reference = results["cvops_out"]  # cvops's 1-thread output: the first step of the run
                    seconds = time_fn(lambda: kept.append(_first_output(step())), device, repeats=repeats, warmup=0)
                    worst = max(diff1(_as_dense(k), reference) for k in kept)
                    fresh = device.type == "cpu"
                    mem = peak_in_fresh_process(lib_name, name, t, tag) if fresh else peak_rss_growth(step)
                    split = phase_split(step) if lib_name == "cvops" else ""
                    if lib_name == "cvops" and t in rates:
                        floor = gemm_flops(model, step) / rates[t]
                        split += (f"; its GEMMs at the machine's {rates[t] / 1e9:.0f} GFLOP/s: {floor * 1e3:.0f} ms "
                                  f"({floor / seconds:.0%} of the step)")
                finally:
                    torch.set_num_threads(threads)
                results[lib_name, t] = (seconds, mem, split, worst)
        params = list(net.parameters())
        io = tensor_bytes(features, indices, params, [p.grad for p in params])
        diff = ""
        if "spconv_out" in results:
            diff = f",diff1={diff1(results['cvops_out'], results['spconv_out']):.1e}"
        for t in counts:
            seconds, mem, split, worst = results["cvops", t]
            strays = f"; its outputs within diff1 {worst:.1e} of its 1-thread one"
            check, anchor_s, anchor_name = f"peak+{mem / 2**20:.0f}MiB{diff}{strays}; {split}", None, ""
            if spt is not None:
                right = [c for c in counts if results["spconv", c][3] <= TOLERANCE]
                best = 1 if t == 1 else min(right or [1], key=lambda c: results["spconv", c][0])
                anchor_s, s_mem, _, _ = results["spconv", best]
                wrong = "".join(f"; spconv {c} thr {results['spconv', c][0] * 1e3:.0f} ms but WRONG (diff1 up to "
                                f"{results['spconv', c][3]:.1e}: not its best)" for c in counts if c not in right)
                check = f"peak+{mem / 2**20:.0f}MiB, spconv peak+{s_mem / 2**20:.0f}MiB{diff}{strays}{wrong}; {split}"
                anchor_name = f"spconv {module_version('spconv')} ({best} thr{'' if t == 1 else ', its best'})"
            backend = "triton" if device.type == "cuda" else f"cpu ({t} thr)"
            rows.append(BenchRow("spconv_backbone", f"{name} {tag} {t}thr", "fwd+bwd", backend, seconds, io, 0.0,
                                 check, anchor_name, anchor_s))
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--peak-of"]:
        _peak_main(*sys.argv[2:6])
        sys.exit()
    bench_main(run, "spconv detection backbones", __doc__,
               (("--repeats", {"dest": "repeats", "type": int, "default": 3}),
                ("--nets", {"dest": "nets", "default": ",".join(CASES_NETS)}), NO_ANCHOR))
