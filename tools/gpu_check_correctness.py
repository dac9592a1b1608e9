"""Section 1 of tools/gpu_check.py: every op on the device against the CPU on the same data, and gradcheck and
``torch.compile`` per op. Pure-IO results must be bit-equal, accumulating ones within diff1, diff2 <= 3e-3; the
oracle is the loop reference where a case is small and the CPU backend (tested equal to it in CI) otherwise."""
from __future__ import annotations

import traceback

TOL = 3e-3


class Checker:
    """Runs the device backend and the CPU oracle on the same data and compares with the docs' metrics."""

    def __init__(self, report, device, dry: bool):
        import torch
        from cvops import metrics
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


def _each_case(ck, op: str, with_double: bool):
    """``(dtype, case)`` of this pass: float32 takes every case of ``op``, the other dtypes its unit cases and
    its first network case."""
    import torch
    for dtype in _dtypes(ck, with_double):
        first_network = None
        for case in _cases(op, ck.dry):
            if dtype != torch.float32 and "network" in case["tags"]:
                first_network = first_network or case["name"]
                if case["name"] != first_network:
                    continue
            yield dtype, case


def check_psamask(ck: Checker) -> None:
    import torch
    import cvops
    for dtype, case in _each_case(ck, "psamask", False):
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
    for dtype, case in _each_case(ck, "carafe", True):
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
    from tests.support.inputs.masked_im2col import case_inputs, case_mask
    seen = set()
    for dtype, case in _each_case(ck, "masked_im2col", True):
        try:
            feature, hi, wi, kernel, pad = case_inputs(case)
            feature = feature.to(dtype)
            key = (dtype, tuple(case["feature"]), case.get("mask_ratio"), case.get("mask_cnt"), tuple(kernel))
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
    for dtype, case in _each_case(ck, "psroipool", True):
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


def check_gradcheck_and_compile(report, device, dry: bool) -> None:
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


