"""Mixed precision: every custom op under ``torch.autocast`` follows its policy (``cvops._core.autocast``).

Data-movement ops keep the dtype they are given and stay bit-exact. Accumulating ops compute in float32
and return the autocast dtype (gradients: the dtype of the tensor each is the gradient of); they are
compared with the float64 reference rounded to the result's dtype (the best a kernel returning that
dtype can do), diff1 and diff2 <= 3e-3. CPU autocast runs here; CUDA uses the same kernels.
"""
from __future__ import annotations

import pytest
import torch

import cvops
from cvops._core import autocast
from cvops._core.dispatch import triton_interpreted
from cvops.metrics import bit_equal, diff1, diff2
from cvops.sparse.functional import indice_conv
from tests.conftest import CPU_PATHS, requires_triton

BACKENDS = CPU_PATHS + [pytest.param("triton", marks=[requires_triton, pytest.mark.skipif(
    not triton_interpreted(), reason="CPU autocast on the triton backend needs TRITON_INTERPRET=1")])]
HALF = [torch.float16, torch.bfloat16]
TOL = 3e-3


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_every_custom_op_has_a_policy_for_cpu_and_cuda():
    ops = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("cvops::")}
    assert ops == set(autocast.POLICIES)
    for name in ops:
        for key in ("AutocastCPU", "AutocastCUDA"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"cvops::{name}", key), (name, key)


def _check_accumulating(call, inputs, grad_of, dtype, backend):
    """Runs ``call`` under autocast(``dtype``) and the float64 reference; compares result and gradients."""
    leaves = [t.clone().requires_grad_(i in grad_of) for i, t in enumerate(inputs)]
    with torch.autocast("cpu", dtype=dtype):
        y = call(*leaves, backend=backend)
    assert y.dtype == dtype
    g = _randn(*y.shape, seed=1).to(dtype)
    y.backward(g)
    wide = [t.double().requires_grad_(i in grad_of) for i, t in enumerate(inputs)]
    y64 = call(*wide, backend="reference")
    y64.backward(g.double())
    pairs = [(y, y64.to(dtype))] + [(leaves[i].grad, wide[i].grad.to(inputs[i].dtype)) for i in grad_of]
    for actual, expected in pairs:
        assert actual.dtype == expected.dtype
        assert diff1(actual, expected) <= TOL and diff2(actual, expected) <= TOL


def _sparse_case():
    idx = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 2], [0, 2, 2, 2], [0, 1, 2, 2]], dtype=torch.int32)
    _, pairs, num = cvops.get_indice_pairs(idx, 1, [3, 3, 3], 3, 1, 1, subm=True, backend="cpu")
    call = lambda f, w, backend: indice_conv(f, w, pairs, num, 4, identity_offset=13, backend=backend)  # noqa: E731
    return call, [_randn(4, 8), _randn(27, 8, 6, seed=3) * 0.2], (0, 1)


FLOAT32_OPS = {
    "carafe": lambda: (lambda f, m, backend: cvops.carafe(f, m, 3, 1, 2, backend=backend),
                       [_randn(1, 4, 3, 4), _randn(1, 9, 6, 8, seed=2).softmax(1)], (0, 1)),
    "psroi_pool": lambda: (lambda x, r, backend: cvops.psroi_pool(x, r, 2, 2, 1.0, 2, 2, backend=backend)[0],
                           [_randn(2, 8, 6, 7), torch.tensor([[0, 0.0, 1.0, 5.0, 4.0], [1, 2.0, 0.0, 6.0, 5.0]])],
                           (0,)),
    "sparse_conv": _sparse_case,
}


@pytest.mark.parametrize("op", list(FLOAT32_OPS))
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", CPU_PATHS)
def test_backward_inside_autocast_gives_float32_leaves_their_float32_gradients(backend, dtype, op):
    # a backward run inside the autocast region goes through the backward ops' autocast kernels: each gradient
    # comes back in its tensor's dtype, computed in float32, so float32 leaves get exactly the gradients of a
    # plain float32 backward (a policy that also cast gradients to the autocast dtype would round them)
    call, inputs, grad_of = FLOAT32_OPS[op]()
    leaves = [t.clone().requires_grad_(i in grad_of) for i, t in enumerate(inputs)]
    plain = [t.clone().requires_grad_(i in grad_of) for i, t in enumerate(inputs)]
    with torch.autocast("cpu", dtype=dtype):
        y = call(*leaves, backend=backend)
        g = _randn(*y.shape, seed=1).to(dtype)
        y.backward(g)
    call(*plain, backend=backend).backward(g.float())
    assert y.dtype == dtype
    for i in grad_of:
        assert leaves[i].grad.dtype == torch.float32
        assert torch.equal(leaves[i].grad, plain[i].grad), (op, i)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", BACKENDS)
def test_carafe_computes_in_float32_returns_the_autocast_dtype(backend, dtype):
    features = _randn(1, 4, 3, 4).to(dtype)
    masks = _randn(1, 9, 6, 8, seed=2).softmax(1)          # a float32 softmax beside float16 features
    call = lambda f, m, backend: cvops.carafe(f, m, 3, 1, 2, backend=backend)  # noqa: E731
    _check_accumulating(call, [features, masks], (0, 1), dtype, backend)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", BACKENDS)
def test_psroi_pool_computes_in_float32_returns_the_autocast_dtype(backend, dtype):
    x = _randn(2, 8, 6, 7).to(dtype)
    rois = torch.tensor([[0, 0.0, 1.0, 5.0, 4.0], [1, 2.0, 0.0, 6.0, 5.0]])
    call = lambda x, r, backend: cvops.psroi_pool(x, r, 2, 2, 1.0, 2, 2, backend=backend)[0]  # noqa: E731
    _check_accumulating(call, [x, rois], (0,), dtype, backend)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sparse_conv_computes_in_float32_returns_the_autocast_dtype(backend, dtype):
    idx = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 2], [0, 2, 2, 2], [0, 1, 2, 2]], dtype=torch.int32)
    _, pairs, num = cvops.get_indice_pairs(idx, 1, [3, 3, 3], 3, 1, 1, subm=True, backend="cpu")
    feats = _randn(4, 8).to(dtype)
    weight = _randn(27, 8, 6, seed=3) * 0.2                   # a float32 parameter
    call = lambda f, w, backend: indice_conv(f, w, pairs, num, 4, identity_offset=13, backend=backend)  # noqa: E731
    _check_accumulating(call, [feats, weight], (0, 1), dtype, backend)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", BACKENDS)
def test_psamask_keeps_the_dtype_bit_exact(backend, dtype):
    x = _randn(1, 9, 4, 5).to(dtype).requires_grad_()
    g = _randn(1, 20, 4, 5, seed=1).to(dtype)
    for mode in ("collect", "distribute"):
        with torch.autocast("cpu", dtype=dtype):
            y = cvops.psamask(x, mode, 3, backend=backend)
        (grad,) = torch.autograd.grad(y, x, g)
        assert y.dtype == grad.dtype == dtype
        assert bit_equal(y, cvops.psamask(x.detach(), mode, 3, backend="reference"))
        assert bit_equal(grad, cvops.psamask_backward(g, mode, 3, backend="reference"))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_im2col_col2im_keep_the_dtype_bit_exact(backend, dtype):
    feature = _randn(1, 3, 5, 6).to(dtype)
    h, w = torch.nonzero(_randn(5, 6, seed=4) > 0, as_tuple=True)
    col = _randn(3, h.numel(), seed=5).to(dtype)
    with torch.autocast("cpu", dtype=dtype):
        data_col = cvops.masked_im2col(feature, h, w, 3, 1, backend=backend)
        image = cvops.masked_col2im(col, h, w, 5, 6, backend=backend)
    assert data_col.dtype == image.dtype == dtype
    assert bit_equal(data_col, cvops.masked_im2col(feature, h, w, 3, 1, backend="reference"))
    assert bit_equal(image, cvops.masked_col2im(col, h, w, 5, 6, backend="reference"))


def test_keep_ops_leave_float32_float32_under_autocast():
    x = _randn(1, 9, 4, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cvops.psamask(x, "collect", 3).dtype == torch.float32


def test_float64_is_left_alone_under_autocast():
    f, m = _randn(1, 4, 3, 4).double(), _randn(1, 9, 6, 8).double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = cvops.carafe(f, m, 3, 1, 2)
    assert y.dtype == torch.float64
    assert bit_equal(y, cvops.carafe(f, m, 3, 1, 2))


@pytest.mark.parametrize("dtype", HALF)
def test_masked_conv2d_computes_like_conv2d_in_the_autocast_dtype(dtype):
    features = _randn(1, 3, 5, 6)
    mask = (_randn(1, 5, 6, seed=6) > 0).float()
    weight, bias = _randn(4, 3, 3, 3, seed=7) * 0.3, _randn(4, seed=8)
    with torch.autocast("cpu", dtype=dtype):
        y = cvops.masked_conv2d(features, mask, weight, bias, padding=1)
    assert y.dtype == dtype
    # the reference: the same dtype-rounded operands, float64 arithmetic, rounded once
    dense = torch.nn.functional.conv2d(*(t.to(dtype).double() for t in (features, weight, bias)), padding=1)
    expected = (dense * (mask[:, None] > 0)).to(dtype)
    assert diff1(y, expected) <= TOL and diff2(y, expected) <= TOL
