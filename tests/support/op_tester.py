"""One tester for every cvops op, after torchvision's ``RoIOpTester`` (``test/test_ops.py``).

An op's test class derives from :class:`OpTester` and declares what is particular to the op: its cases
(``cases/<op>.json``'s unit cases, read through :mod:`tests.support.cases`), how to build its inputs
(:class:`Sample`), how to call it (:meth:`OpTester.run`: every result the tests compare, the explicit
backward's included), its reference (the ``"reference"`` backend) and its tolerance: pure-IO ops are
bit-exact (``bit_equal`` and ``diff3 == 0``), accumulating ops pass with ``diff1``/``diff2`` of
:mod:`cvops.metrics` at most :meth:`OpTester.tolerance` (3e-3 unless the op asks for less), with NaN and
infinities at the same places. The tester then runs, for every op and on every backend (``reference``,
``torch``, ``numba``, ``triton`` under ``TRITON_INTERPRET=1``):

- the unit cases, every dtype, both layouts where the op has them, non-contiguous inputs, NaN and
  infinities, a hypothesis property test and run-to-run determinism, each against the reference;
- zero-element inputs and the op's catalogue of bad input (the exception and the words naming the rule);
- ``gradcheck`` (and ``gradgradcheck`` where the backward is differentiable), ``torch.library.opcheck``
  of every custom op a forward and backward call, ``torch.compile(fullgraph=True)``,
  ``torch.export.export`` and ``torch.jit.script`` where the op supports them.

The slow checks run on the op's small samples (:meth:`OpTester.grad_samples`); network-scale cases stay
in the op's own file (forward agreement only). A check an op does not support is skipped, saying why.
"""
from __future__ import annotations

import io
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch.utils._python_dispatch import TorchDispatchMode

from cvops._core.errors import BadParamError, CvopsError, NotSupportedError, Status
from cvops.metrics import bit_equal, diff1, diff2, diff3
from tests.conftest import requires_numba, requires_triton
from tests.support.cases import case_id, load_cases

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LAYOUTS = ("NCHW", "NHWC")
FAST = ("torch", "numba", "triton")   # compared with the reference
ALL = ("reference",) + FAST
_MARKS = {"numba": requires_numba, "triton": requires_triton}


def backend_params(names):
    """pytest params of ``names``, each backing off where its backend is missing."""
    return [pytest.param(b, marks=_MARKS[b]) if b in _MARKS else b for b in names]


class Sample(dict):
    """One call of an op: its tensors and parameters by name (``s.x`` or ``s["x"]``)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def replace(self, **changes) -> "Sample":
        return Sample({**self, **changes})

    def tensors(self) -> dict:
        return {k: v for k, v in self.items() if isinstance(v, torch.Tensor)}


def strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view that steps by 2 in every dimension and starts past its storage's first element."""
    base = t.new_zeros([2 * n for n in t.shape])
    view = base[tuple(slice(1, None, 2) for _ in t.shape)]
    view.copy_(t)
    return view


def transposed(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values stored with its dimensions in reverse order (a channels-last-like permutation)."""
    order = list(range(t.dim()))[::-1]
    return t.permute(order).contiguous().permute(order)


def plant_specials(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with NaN, +inf, -inf and (float32/float64) a NaN carrying a payload planted."""
    t = t.detach().clone().contiguous()
    flat, n = t.view(-1), t.numel()
    if n >= 5:
        flat[n // 5], flat[2 * n // 5], flat[3 * n // 5] = float("nan"), float("inf"), float("-inf")
        if t.dtype == torch.float32:
            flat.view(torch.int32)[4 * n // 5] = 0x7FC00123
        elif t.dtype == torch.float64:
            flat.view(torch.int64)[4 * n // 5] = 0x7FF8000000000123
    return t


def _as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


class _Capture(TorchDispatchMode):
    """Records the first call (with its arguments) of every ``torch.ops.cvops`` operator."""

    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "cvops":
            self.calls.setdefault(str(func), (func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


_REFERENCE: dict = {}   # reference results of the unit cases, by (op, case, layout, dtype, sample)


class OpTester:
    """Base class of an op's tests; a subclass ``Test<Op>`` declares the op and inherits the tests."""

    op: str = ""                    # its cases file: cases/<op>.json
    exact = True                    # pure IO: bit-exact; else diff1/diff2 <= tolerance(); or one bool per result
    layouts: tuple = (None,)        # LAYOUTS for ops with a layout argument
    dtypes: tuple = FLOATS          # the dtypes of the data tensors (test_dtype)
    base_dtype = torch.float32      # the dtype of the samples of the checks that do not vary it
    case_dtypes: tuple = (torch.float32,)   # the dtypes each unit case runs in
    reference_in_float64 = False    # test_dtype: compare with the reference on float64 inputs (no rounding)
    exact_zeros = False             # accumulating ops: exact zeros of the reference stay exact zeros
    pointwise = None                # accumulating ops with NaN/inf planted: also |a - e| <= atol + rtol * |e|
    special_inputs: tuple = ()      # tensors that get NaN and inf planted (test_nan_inf); none: no such test
    double_backward = False         # gradgradcheck too
    gradcheck_fast: tuple = ("triton",)   # backends gradchecked in fast mode (slow per call)
    gradgradcheck_fast: tuple = ()  # backends gradgradchecked in fast mode (never the interpreter's)
    script_saves = True             # the scripted module saves and loads (no Python function left in it)
    opcheck_backward = True         # opcheck the backward's operators too (they need gradients of their own)
    property_examples = {"torch": 25, "numba": 25, "triton": 5}
    bad_inputs: tuple = ()          # (id, call(backend), exception, message fragment)

    # ------------------------------------------------------------------------------ what an op declares
    def unit_cases(self) -> list[dict]:
        return load_cases(self.op, "unit")

    def case_samples(self, case: dict, layout, dtype) -> list[Sample]:
        """The samples of one unit case (one per mode the case does not fix)."""
        raise NotImplementedError

    def interpretable(self, case: dict) -> bool:
        """Whether a unit case is small enough for the Triton interpreter."""
        return True

    def small_samples(self, layout, dtype) -> list[Sample]:
        """A few small samples: the dtype, contiguity, NaN and determinism checks."""
        raise NotImplementedError

    def grad_samples(self, layout) -> list[Sample]:
        """Tiny float64 samples for gradcheck, opcheck, compile, export and script."""
        return self.small_samples(layout, torch.float64)

    def special_samples(self, layout) -> list[Sample]:
        """Samples with NaN and infinities: by default the small float32 ones with :func:`plant_specials` applied
        to :attr:`special_inputs`."""
        return [s.replace(**{k: plant_specials(s[k]) for k in self.special_inputs})
                for s in self.small_samples(layout, self.base_dtype)]

    def deterministic_samples(self, layout, backend) -> list[Sample]:
        """Samples run twice for run-to-run determinism (large enough for a parallel path where it matters)."""
        return self.small_samples(layout, self.base_dtype)

    def gradgrad_samples(self, layout) -> list[Sample]:
        """The samples of gradgradcheck (by default :meth:`grad_samples`)."""
        return self.grad_samples(layout)

    def zero_samples(self, layout) -> list[tuple[Sample, tuple]]:
        """``(sample, shapes of run's results)`` with zero-element inputs."""
        return []

    def check_zero(self, results: tuple, sample: Sample) -> None:
        """What a zero-element call returns besides its shapes: by default floating results are zeros."""
        for r in results:
            assert not r.is_floating_point() or not r.any()

    def run(self, sample: Sample, backend) -> tuple:
        """Every result the tests compare with the reference: the forward's, then the explicit backward's."""
        raise NotImplementedError

    def autograd(self, sample: Sample, backend):
        """``(fn, tensors)``: ``fn(*tensors)`` is the differentiable call (tensors the inputs it differentiates)."""
        return None

    def module(self, sample: Sample):
        """``(nn.Module, args)`` running the sample under ``torch.jit.script``, or None."""
        return None

    def strategy(self, backend):
        """A hypothesis strategy of samples (small for the Triton interpreter), or None."""
        return None

    def tolerance(self, dtype: torch.dtype, backend: str) -> float:
        return 1e-12 if dtype == torch.float64 else 3e-3

    # ------------------------------------------------------------------------------ parametrization
    def pytest_generate_tests(self, metafunc):
        names = metafunc.fixturenames
        if "case" in names:
            metafunc.parametrize("case", self.unit_cases(), ids=case_id)
        if "layout" in names:
            metafunc.parametrize("layout", self.layouts, ids=[str(x) for x in self.layouts])
        if "dtype" in names:
            metafunc.parametrize("dtype", self.dtypes, ids=[str(d).split(".")[-1] for d in self.dtypes])
        if "bad" in names:
            metafunc.parametrize("bad", self.bad_inputs, ids=[b[0] for b in self.bad_inputs])
        if "backend" in names:
            metafunc.parametrize("backend", backend_params(self._backends_of(metafunc.function.__name__)))

    def _backends_of(self, test: str) -> tuple:
        if test in ("test_gradcheck", "test_zero_elements", "test_bad_input"):
            return ALL
        return FAST

    # ------------------------------------------------------------------------------ comparing
    def results(self, sample: Sample, backend: str) -> tuple:
        """``run`` on ``backend``, its results as a tuple."""
        return _as_tuple(self.run(sample, backend))

    def assert_matches(self, actual, expected, backend: str, what: str = "", pointwise=None,
                       wide_reference=False) -> None:
        """Each of ``actual`` against ``expected`` (the reference): bit-exact for pure-IO ops and integer results,
        else diff1/diff2 within :meth:`tolerance` and NaN/inf at the same places. ``wide_reference``: the
        expected floating results are float64 (the reference on the sample widened to float64)."""
        actual, expected = _as_tuple(actual), _as_tuple(expected)
        assert len(actual) == len(expected), what
        for i, (a, e) in enumerate(zip(actual, expected)):
            where = (what, backend, i)
            same_dtype = a.dtype == e.dtype or (wide_reference and e.dtype == torch.float64 and a.is_floating_point())
            assert a.shape == e.shape and same_dtype, (where, a.shape, e.shape, a.dtype, e.dtype)
            if self._exact(i) or not e.is_floating_point():
                assert bit_equal(a, e), where
                assert not e.is_floating_point() or diff3(a, e) == 0, where
                continue
            a64, e64 = a.detach().double().cpu(), e.detach().double().cpu()
            assert torch.equal(a64.isnan(), e64.isnan()), where
            inf = e64.isinf()
            assert torch.equal(a64.isinf(), inf) and torch.equal(a64[inf], e64[inf]), where
            finite = e64.isfinite()
            tol = self.tolerance(a.dtype, backend)
            d1, d2 = diff1(a64[finite], e64[finite]), diff2(a64[finite], e64[finite])
            assert d1 <= tol and d2 <= tol, (where, d1, d2, tol)
            if self.exact_zeros:
                zero = e64 == 0
                assert torch.equal(a64[zero], e64[zero]), where
            if pointwise is not None and e.dtype in (torch.float32, torch.float64):
                rtol, atol = pointwise
                assert torch.allclose(a64[finite], e64[finite], rtol=rtol, atol=atol), where

    def _exact(self, i: int) -> bool:
        return self.exact[i] if isinstance(self.exact, tuple) else self.exact

    def check(self, sample: Sample, backend: str, expected=None, what: str = "", pointwise=None) -> tuple:
        """The sample on ``backend`` against the reference (given, or computed here); returns the reference."""
        if expected is None:
            expected = self.results(sample, "reference")
        self.assert_matches(self.results(sample, backend), expected, backend, what, pointwise)
        return expected

    def _expected(self, key, sample):
        key = (type(self).__name__,) + key
        if key not in _REFERENCE:
            _REFERENCE[key] = self.results(sample, "reference")
        return _REFERENCE[key]

    # ------------------------------------------------------------------------------ against the reference
    def test_unit_case(self, backend, case, layout):
        if backend == "triton" and not self.interpretable(case):
            pytest.skip("the Triton interpreter runs the small cases only")
        for dtype in self.case_dtypes:
            for i, sample in enumerate(self.case_samples(case, layout, dtype)):
                expected = self._expected((case["name"], layout, str(dtype), i), sample)
                self.assert_matches(self.results(sample, backend), expected, backend, f"{case['name']} #{i}")

    def test_dtype(self, backend, dtype, layout):
        for i, sample in enumerate(self.small_samples(layout, dtype)):
            actual = self.results(sample, backend)
            assert all(not a.is_floating_point() or a.dtype == dtype for a in actual)
            if self.reference_in_float64:
                wide = sample.replace(**{k: t.double() for k, t in sample.tensors().items() if t.is_floating_point()})
                self.assert_matches(actual, self.results(wide, "reference"), backend, f"#{i}", wide_reference=True)
            else:
                self.assert_matches(actual, self.results(sample, "reference"), backend, f"#{i}")

    def _interpreted(self, samples: list, backend: str) -> list:
        """The Triton interpreter runs the first sample only where a check repeats every sample several times."""
        return samples[:1] if backend == "triton" else samples

    def test_non_contiguous(self, backend, layout):
        for i, sample in enumerate(self._interpreted(self.small_samples(layout, self.base_dtype), backend)):
            expected = self.results(sample, "reference")
            # the interpreter: one view (a kernel reads any strides the same way; the cpu paths pick by layout)
            for view in (strided,) if backend == "triton" else (strided, transposed):
                changed = sample.replace(**{k: view(t) for k, t in sample.tensors().items()})
                assert any(not t.is_contiguous() for t in changed.tensors().values())
                self.check(changed, backend, expected, f"#{i} {view.__name__}")

    @pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's numpy
    def test_nan_inf(self, backend, layout):
        if not self.special_inputs:
            pytest.skip(f"{self.op}: no floating-point data")
        values = []
        for i, special in enumerate(self.special_samples(layout)):
            expected = self.check(special, backend, what=f"#{i}", pointwise=self.pointwise)
            floats = [e.detach().double().flatten() for e in expected if e.is_floating_point()]
            assert not all(f.isfinite().all() for f in floats), f"#{i}: the planted values reach the results"
            values += floats
        values = torch.cat(values)
        assert values.isnan().any() and values.isinf().any(), "the planted values reach the results"
        if not all(self._exact(i) for i in range(len(expected))):
            assert values.isfinite().any(), "finite results left to compare"

    def test_deterministic(self, backend, layout):
        if backend == "triton" and layout != self.layouts[0]:
            pytest.skip("the Triton interpreter runs numpy in order: one layout is enough")
        for sample in self._interpreted(self.deterministic_samples(layout, backend), backend):
            first, second = self.results(sample, backend), self.results(sample, backend)
            assert all(bit_equal(a, b) for a, b in zip(first, second))

    def test_property(self, backend):
        strategy = self.strategy(backend)
        if strategy is None:
            pytest.skip(f"{self.op}: no property test")

        @settings(max_examples=self.property_examples[backend], deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(sample=strategy)
        def matches_reference(sample):
            try:
                expected = self.results(sample, "reference")
            except CvopsError as err:  # a drawn call the reference rejects: rejected alike, for the same rule
                with pytest.raises(type(err), match=re.escape(str(err))):
                    self.results(sample, backend)
                return
            self.check(sample, backend, expected)

        matches_reference()

    # ------------------------------------------------------------------------------ edges
    def test_zero_elements(self, backend, layout):
        samples = self.zero_samples(layout)
        if not samples:
            pytest.skip(f"{self.op}: no zero-element inputs")
        for sample, shapes in samples:
            results = self.results(sample, backend)
            assert tuple(tuple(r.shape) for r in results) == tuple(tuple(s) for s in shapes)
            self.check_zero(results, sample)
            if backend != "reference":
                self.assert_matches(results, self.results(sample, "reference"), backend)

    def test_bad_input(self, backend, bad):
        _, call, error, fragment = bad
        with pytest.raises(error, match=fragment) as info:
            call(backend)
        if isinstance(info.value, BadParamError):
            assert info.value.status == Status.BAD_PARAM and isinstance(info.value, ValueError)

    @requires_triton
    def test_triton_needs_cuda_or_the_interpreter(self, monkeypatch):
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(NotSupportedError, match="CUDA"):
            self.run(self.small_samples(self.layouts[0], self.base_dtype)[0], "triton")

    # ------------------------------------------------------------------------------ autograd and graphs
    def _autograd_samples(self, layout):
        if self.autograd(self.grad_samples(layout)[0], None) is None:
            pytest.skip(f"{self.op}: not differentiable")
        return self.grad_samples(layout)

    def test_gradcheck(self, backend, layout):
        # the interpreter: the first sample; the double backward's wiring is the op's registration, checked on the
        # other backends (the backward op's own kernel is gradchecked here as the forward's adjoint)
        samples = self._interpreted(self._autograd_samples(layout), backend)
        double = self.double_backward and backend != "triton"
        for sample in samples:
            fn, tensors = self.autograd(sample, backend)
            leaves = tuple(t.detach().clone().requires_grad_() for t in tensors)
            assert torch.autograd.gradcheck(fn, leaves, fast_mode=backend in self.gradcheck_fast)
        for sample in self.gradgrad_samples(layout) if double else ():
            fn, tensors = self.autograd(sample, backend)
            leaves = tuple(t.detach().clone().requires_grad_() for t in tensors)
            assert torch.autograd.gradgradcheck(fn, leaves, fast_mode=backend in self.gradgradcheck_fast)

    def _callable(self, sample):
        """``(fn, tensors)`` of :meth:`autograd`, or for an op without gradients ``run`` on the sample's tensors."""
        built = self.autograd(sample, None)
        if built is not None:
            return built
        names = list(sample.tensors())
        return (lambda *t: self.run(sample.replace(**dict(zip(names, t))), None)), tuple(sample[n] for n in names)

    def _calls(self, sample):
        """Every cvops operator one forward (and backward, where there is one) of ``sample`` calls."""
        fn, tensors = self._callable(sample)
        leaves = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors)
        with _Capture() as capture:
            out = [o for o in _as_tuple(fn(*leaves)) if o.requires_grad]
            if out and self.opcheck_backward:
                torch.autograd.backward(out, [torch.ones_like(o) for o in out])
        return capture.calls

    def test_opcheck(self, layout):
        """``torch.library.opcheck`` (schema, fake tensors, autograd registration, AOT dispatch with dynamic
        shapes) on each cvops operator a forward and backward call reaches."""
        for sample in self.grad_samples(layout):
            calls = self._calls(sample)
            assert calls, "the call reaches a cvops operator"
            for name, (func, args, kwargs) in calls.items():
                result = torch.library.opcheck(func, args, kwargs)
                assert all(v == "SUCCESS" for v in result.values()), (name, result)

    def _call_module(self, sample):
        fn, tensors = self._callable(sample)

        class Call(torch.nn.Module):
            def forward(self, *args):
                return fn(*args)

        return Call(), tuple(tensors)

    def test_compile(self, layout):
        """The call (and the op's module, where it has one) under ``torch.compile(fullgraph=True)``: the eager
        results and gradients."""
        torch._dynamo.reset()
        for sample in self.grad_samples(layout):
            for module, args in [self._call_module(sample)] + [m for m in [self.module(sample)] if m is not None]:
                compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
                eager_args = tuple(a.detach().clone().requires_grad_(a.is_floating_point()) for a in args)
                compiled_args = tuple(a.detach().clone().requires_grad_(a.is_floating_point()) for a in args)
                expected, actual = _as_tuple(module(*eager_args)), _as_tuple(compiled(*compiled_args))
                self.assert_matches(actual, expected, "compile", type(module).__name__)
                grads = [torch.randn(o.shape, dtype=o.dtype, generator=torch.Generator().manual_seed(i))
                         for i, o in enumerate(expected) if o.requires_grad]
                if grads:
                    torch.autograd.backward([o for o in expected if o.requires_grad], grads)
                    torch.autograd.backward([o for o in actual if o.requires_grad], grads)
                    pairs = [(c.grad, e.grad) for c, e in zip(compiled_args, eager_args) if e.grad is not None]
                    assert pairs and all(c is not None for c, _ in pairs)
                    self.assert_matches(*zip(*pairs), "compile", "grads")

    def test_export(self, layout):
        for sample in self.grad_samples(layout):
            module, args = self._call_module(sample)
            exported = torch.export.export(module, args)
            ops = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
            assert any(op.startswith("cvops.") for op in ops), ops  # the custom op stays in the graph
            self.assert_matches(exported.module()(*args), module(*args), "export")

    def test_script(self, layout):
        built = [b for b in map(self.module, self.grad_samples(layout)) if b is not None]
        if not built:
            pytest.skip(f"{self.op}: no scriptable module" + (f" in layout {layout}" if layout else ""))
        for module, args in built:
            scripted = torch.jit.script(module)
            expected = _as_tuple(module(*args))
            self.assert_matches(scripted(*args), expected, "script")
            if self.script_saves:
                buffer = io.BytesIO()
                torch.jit.save(scripted, buffer)
                buffer.seek(0)
                self.assert_matches(torch.jit.load(buffer)(*args), expected, "script", "saved and loaded")
