"""Triton kernels compiled for real NVIDIA targets on a machine without a GPU.

Under ``TRITON_INTERPRET=1`` every ``@triton.jit`` function is an ``InterpretedFunction``: its launches run
in numpy and say nothing about what the GPU compiler makes of them. :class:`Recorder` wraps the
interpreter's launch and records each launch's *specialisation*, computed with Triton's own binder for
the CUDA backend: argument types (pointer element type, ``i32`` / ``i64`` integers), the integers Triton
turns into constants (value 1) or marks divisible by 16, the constexprs and ``num_warps``. Specialisations
that differ only in launch-independent details are the same :class:`Spec`, so a test suite's launches
collapse to a few per kernel.

:func:`compile_specs` compiles each spec with ``triton.compile`` for ``sm_80`` and ``sm_90a`` in worker
processes started without ``TRITON_INTERPRET`` (there the kernels are real ``JITFunction``s), and reads
ptxas's own report (``-v``) of registers, spills and stack. :func:`occupancy` turns registers and shared
memory into resident warps per SM.

Register budget: a kernel module may set ``REGISTER_BUDGET`` (registers per thread at its launch
configuration); the default, :data:`DEFAULT_BUDGET`, is for data-movement kernels.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import os
import pkgutil
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable

TARGETS = {"sm_80": 80, "sm_90a": 90}
DEFAULT_BUDGET = 64

# Per-SM limits (CUDA occupancy calculator): registers, resident warps, resident blocks, shared memory per SM.
_SM_LIMITS = {80: (65536, 64, 32, 164 * 1024), 90: (65536, 64, 32, 228 * 1024)}
_REG_GRANULE = 256   # registers are allocated per warp in units of 256


@dataclasses.dataclass(frozen=True)
class Spec:
    """One specialisation of one kernel: what ``triton.compile`` needs to build it."""
    module: str
    kernel: str
    signature: tuple   # ((arg name, type), ...): '*fp32', 'i32', 'i64', 'constexpr', ...
    constexprs: tuple  # ((arg index, value), ...): constexpr arguments and integer arguments equal to 1
    divisible: tuple   # indices of pointer / integer arguments specialised as divisible by 16
    num_warps: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Spec":
        return cls(d["module"], d["kernel"], tuple(tuple(x) for x in d["signature"]),
                   tuple(tuple(x) for x in d["constexprs"]), tuple(d["divisible"]), d["num_warps"])

    def describe(self) -> str:
        """Element types, the constexpr values and the arguments passed as 64-bit integers."""
        names = [n for n, _ in self.signature]
        types = sorted({t for _, t in self.signature if t.startswith("*")})
        const = {names[i]: v for i, v in self.constexprs if names[i].isupper()}
        wide = [n for n, t in self.signature if t == "i64"]
        return f"{','.join(types)} {const}" + (f" i64:{','.join(wide)}" if wide else "")


@dataclasses.dataclass
class Result:
    spec: Spec
    target: str
    registers: int = 0
    spill_bytes: int = 0       # spill stores + spill loads
    stack_bytes: int = 0
    shared_bytes: int = 0      # Triton's dynamic shared memory + static shared memory
    error: str = ""

    @property
    def occupancy(self) -> float:
        return occupancy(self.registers, self.shared_bytes, self.spec.num_warps, TARGETS[self.target])

    @property
    def budget(self) -> int:
        return register_budget(self.spec.module)


def occupancy(registers: int, shared_bytes: int, num_warps: int, capability: int) -> float:
    """Fraction of an SM's warp slots a kernel can fill, from registers and shared memory per block."""
    regs_sm, warps_sm, blocks_sm, smem_sm = _SM_LIMITS[capability]
    per_warp = -(-max(registers, 1) * 32 // _REG_GRANULE) * _REG_GRANULE
    blocks = min(blocks_sm, warps_sm // num_warps, regs_sm // (per_warp * num_warps))
    if shared_bytes:
        blocks = min(blocks, smem_sm // shared_bytes)
    return blocks * num_warps / warps_sm


def register_budget(module: str) -> int:
    return getattr(importlib.import_module(module), "REGISTER_BUDGET", DEFAULT_BUDGET)


# ---------------------------------------------------------------------------------------------- recording

def _cuda_backend():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    return make_backend(GPUTarget("cuda", 90, 32))


class Recorder:
    """Context manager: records the :class:`Spec` of every interpreted Triton launch (counts in ``specs``).

    ``execute=False`` records without running the kernel (for launches on meta tensors).
    """

    def __init__(self, execute: bool = True):
        self.specs: Counter = Counter()
        self.execute = execute
        self._binders: dict = {}

    def spec_of(self, fn, args, kwargs) -> Spec:
        from triton.runtime.jit import JITFunction, create_function_from_signature
        if fn not in self._binders:
            jf = JITFunction(fn)
            backend = _cuda_backend()
            self._binders[fn] = (jf, backend, create_function_from_signature(jf.signature, jf.params, backend))
        jf, backend, binder = self._binders[fn]
        bound, specialization, options = binder(*args, **kwargs)
        opts, signature, constexprs, attrs = jf._pack_args(backend, dict(kwargs), bound, specialization, options)
        const = tuple(sorted((path[0], _plain(value)) for path, value in constexprs.items()))
        divisible = tuple(sorted(path[0] for path, kv in attrs.items() if ["tt.divisibility", 16] in kv))
        return Spec(fn.__module__, fn.__name__, tuple(signature.items()), const, divisible, opts.num_warps)

    def __enter__(self):
        from triton.runtime.interpreter import InterpretedFunction
        self._original = original = InterpretedFunction.run
        recorder = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            recorder.specs[recorder.spec_of(fn_self.fn, args, kwargs)] += 1
            if recorder.execute:
                return original(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
            return None

        InterpretedFunction.run = run
        return self

    def __exit__(self, *exc):
        from triton.runtime.interpreter import InterpretedFunction
        InterpretedFunction.run = self._original
        return False


def _plain(value):
    return value.value if hasattr(value, "value") else value


def save(specs: Iterable[Spec], path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps([s.to_json() for s in specs]))


def load(path: str | os.PathLike) -> list[Spec]:
    return [Spec.from_json(d) for d in json.loads(Path(path).read_text())]


# ---------------------------------------------------------------------------------------------- discovery

def launchable_kernels(package: str = "cvops") -> set[tuple[str, str]]:
    """``(module, name)`` of every ``@triton.jit`` function in the package's ``triton`` modules that no
    other one calls (a kernel, not a device helper)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    root = importlib.import_module(package)
    found = set()
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if info.name.rsplit(".", 1)[-1] != "triton":
            continue
        module = importlib.import_module(info.name)
        jitted = {name: inspect.getsource(obj.fn) for name, obj in vars(module).items()
                  if isinstance(obj, (InterpretedFunction, JITFunction)) and obj.fn.__module__ == info.name}
        for name in jitted:
            call = re.compile(rf"\b{name}\(")
            if not any(call.search(src) for other, src in jitted.items() if other != name):
                found.add((info.name, name))
    return found


# ---------------------------------------------------------------------------------------------- compiling

_PTXAS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads.*?"
                    r"Used (\d+) registers(?:.*?(\d+) bytes smem)?", re.S)


def _compile_one(spec: Spec, target: str) -> Result:
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    result = Result(spec, target)
    fn = getattr(importlib.import_module(spec.module), spec.kernel)
    constexprs = {(i,): v for i, v in spec.constexprs}
    attrs = {(i,): [["tt.divisibility", 16]] for i in spec.divisible}
    knobs.nvidia.dump_ptxas_log = True
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            kernel = triton.compile(ASTSource(fn, dict(spec.signature), constexprs, attrs),
                                    target=GPUTarget("cuda", TARGETS[target], 32),
                                    options={"num_warps": spec.num_warps})
    except Exception as e:  # noqa: BLE001  (a compile error is a result to report)
        result.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
        return result
    match = _PTXAS.search(log.getvalue())
    if match is None:
        result.error = "no ptxas report: " + log.getvalue()[-200:]
        return result
    stack, spill_st, spill_ld, regs, smem = match.groups()
    result.registers = int(regs)
    result.stack_bytes = int(stack)
    result.spill_bytes = int(spill_st) + int(spill_ld)
    result.shared_bytes = int(kernel.metadata.shared) + int(smem or 0)
    return result


def _worker() -> None:
    """Compiles the (spec, target) jobs read as JSON from stdin; writes one JSON result per line."""
    for line in sys.stdin:
        job = json.loads(line)
        r = _compile_one(Spec.from_json(job["spec"]), job["target"])
        out = dataclasses.asdict(r)
        print(json.dumps(out), flush=True)


def compile_specs(specs: Iterable[Spec], targets: Iterable[str] = tuple(TARGETS), workers: int = 2) -> list[Result]:
    """Compiles every spec for every target in ``workers`` processes (without the interpreter)."""
    jobs = [json.dumps({"spec": s.to_json(), "target": t}) for s in specs for t in targets]
    if not jobs:
        return []
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["TRITON_ALWAYS_COMPILE"] = "1"   # a cache hit would skip ptxas and its report
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # the default today; set so triton does not warn
    src = str(Path(__file__).resolve().parents[2] / "src")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([src, root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    workers = max(1, min(workers, len(jobs)))
    procs = []
    for w in range(workers):
        chunk = "\n".join(jobs[w::workers]) + "\n"
        p = subprocess.Popen([sys.executable, "-c", "from tests.support.triton_specs import _worker; _worker()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             cwd=root, text=True)
        procs.append((p, chunk))
    results = []
    for p, chunk in procs:
        out, err = p.communicate(chunk)
        if p.returncode != 0:
            raise RuntimeError(f"compile worker failed ({p.returncode}):\n{err[-2000:]}")
        for line in out.splitlines():
            d = json.loads(line)
            d["spec"] = Spec.from_json(d["spec"])
            results.append(Result(**d))
    return results


# ---------------------------------------------------------------------------------------------- reporting

def problems(results: Iterable[Result]) -> list[str]:
    """Compile errors, spills, stack use and registers over budget, one line each."""
    out = []
    for r in results:
        where = f"{r.spec.module}.{r.spec.kernel} [{r.target}, {r.spec.describe()}]"
        if r.error:
            out.append(f"{where}: compile error: {r.error}")
        elif r.spill_bytes or r.stack_bytes:
            out.append(f"{where}: {r.spill_bytes} spill bytes, {r.stack_bytes} stack bytes")
        elif r.registers > r.budget:
            out.append(f"{where}: {r.registers} registers > budget {r.budget}")
    return out


def table(results: Iterable[Result]) -> str:
    """One row per (kernel, target): specialisations, register range, spills, shared memory, occupancy."""
    rows: dict = {}
    for r in results:
        rows.setdefault((r.spec.module.split(".")[-2], r.spec.kernel, r.target), []).append(r)
    head = ("op", "kernel", "target", "specs", "warps", "registers", "budget", "spill B", "smem B", "occupancy",
            "errors")
    lines = [head]
    for (op, kernel, target), rs in sorted(rows.items()):
        ok = [r for r in rs if not r.error]
        regs = sorted(r.registers for r in ok)
        occ = sorted(r.occupancy for r in ok)
        lines.append((op, kernel, target, str(len(rs)), ",".join(sorted({str(r.spec.num_warps) for r in rs})),
                      f"{regs[0]}-{regs[-1]}" if regs else "-", str(rs[0].budget),
                      str(max((r.spill_bytes for r in ok), default=0)),
                      str(max((r.shared_bytes for r in ok), default=0)),
                      f"{occ[0]:.0%}-{occ[-1]:.0%}" if occ else "-", str(len(rs) - len(ok))))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    fmt = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([fmt(lines[0]), fmt(tuple("-" * w for w in widths))] + [fmt(r) for r in lines[1:]])
