"""Bad input at every public entry point: each class of bad argument (wrong type, dtype, rank, shapes,
impossible sizes, non-finite values where they are rejected, bad layout/backend strings, mixed
devices) raises the exact cvops exception naming the argument, on every backend, and the MLU-OPS
layer returns a status instead of raising."""
from __future__ import annotations

import pytest
import torch

import cvops
from cvops._core.errors import BadParamError, NotSupportedError
from tests.conftest import requires_triton, selected

BACKENDS = ["reference", "cpu-torch", pytest.param("cpu-numba", marks=pytest.mark.skipif(
    not __import__("cvops._core.jit", fromlist=["x"]).numba_available(), reason="no numba")),
            pytest.param("triton", marks=requires_triton)]


# ------------------------------------------------------------------------------------------ modules
MODULE_CASES = [
    (lambda: cvops.nn.CARAFEPack(8, 0), "scale_factor must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, -2), "scale_factor must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(0, 2), "channels must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, up_kernel=0), "kernel_size must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, up_kernel=4), "kernel_size must be odd"),
    (lambda: cvops.nn.CARAFEPack(8, 2, up_group=0), "group_size must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, up_group=3), "divisible by up_group"),
    (lambda: cvops.nn.CARAFEPack(8, 2, encoder_kernel=0), "encoder_kernel must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, encoder_kernel=2), "encoder_kernel must be odd"),
    (lambda: cvops.nn.CARAFEPack(8, 2, encoder_dilation=0), "encoder_dilation must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, compressed_channels=0), "compressed_channels must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8.0, 2), "channels must be an int"),
    (lambda: cvops.nn.CARAFE(0, 1, 2), "kernel_size must be >= 1"),
    (lambda: cvops.nn.CARAFE(3, 0, 2), "group_size must be >= 1"),
    (lambda: cvops.nn.CARAFE(3, 1, 0), "scale_factor must be >= 1"),
    (lambda: cvops.nn.CARAFE(2, 1, 2), "kernel_size must be odd"),
    (lambda: cvops.nn.CARAFE("3", 1, 2), "kernel_size must be an int"),
    (lambda: cvops.nn.CARAFENaive(3, 1, -1), "scale_factor must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(0, 3, 3), "in_channels must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 0, 3), "out_channels must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 0), "kernel_size must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, (3, -1)), "kernel_size must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 3, stride=0), "stride must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 3, padding=-1), "padding must be >= 0"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 3, dilation=0), "dilation must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 3, groups=0), "groups must be >= 1"),
    (lambda: cvops.nn.PSAMask("collect", 0), "mask_size must be >= 1"),
    (lambda: cvops.nn.PSAMask("collect", (3, -3)), "mask_size must be >= 1"),
    (lambda: cvops.nn.PSAMask("scatter", 3), "psa_type"),
    (lambda: cvops.nn.PSRoIPool(0, 1.0), "pooled_size must be >= 1"),
    (lambda: cvops.nn.PSRoIPool(2, 0.0), "spatial_scale"),
    (lambda: cvops.nn.PSRoIPool(2, float("nan")), "spatial_scale"),
    (lambda: cvops.nn.PSRoIPool(2, 1.0, output_dim=0), "output_dim must be >= 1"),
]


@pytest.mark.parametrize("index", range(len(MODULE_CASES)))
def test_modules_reject_impossible_sizes_at_construction(index):
    build, fragment = MODULE_CASES[index]
    with pytest.raises(BadParamError, match=fragment):
        build()


# ------------------------------------------------------------------------------------------ MLU-OPS layer
from cvops import mluops  # noqa: E402
from cvops._core.errors import Status  # noqa: E402

NHWC, NCHW, ARRAY = mluops.Layout.NHWC, mluops.Layout.NCHW, mluops.Layout.ARRAY


def _d(t, layout=ARRAY):
    return mluops.descriptor_of(t, layout)


def _carafe_desc(k=3, g=1, s=2):
    desc = mluops.create_carafe_descriptor()
    assert mluops.set_carafe_descriptor(desc, 4, k, g, s) == Status.SUCCESS
    return desc


def _sparse_desc():
    desc = mluops.create_sparse_convolution_descriptor()
    assert mluops.set_sparse_convolution_descriptor(desc, 5, 1, [1] * 3, [1] * 3, [1] * 3, [4] * 3, [3] * 3,
                                                    [4] * 3, 1, 0, 0) == Status.SUCCESS
    return desc


def _mlu_calls():
    """``name -> (function, valid positional args, {position: kind})``; kinds pick the bad values."""
    x, m, y = torch.randn(1, 3, 4, 2), torch.rand(1, 6, 8, 9), torch.zeros(1, 6, 8, 2)
    gx, gm = torch.zeros_like(x), torch.zeros_like(m)
    feature, idx = torch.randn(1, 2, 4, 5), torch.tensor([0, 3, 1], dtype=torch.int32)
    col = torch.zeros(2 * 9, 3)
    px, py = torch.randn(1, 3, 4, 9), torch.zeros(1, 3, 4, 12)
    rx, rois = torch.randn(1, 6, 6, 8), torch.tensor([[0.0, 0, 0, 4, 4]])
    rout, rmap = torch.zeros(1, 2, 2, 2), torch.zeros(1, 2, 2, 2, dtype=torch.int32)
    rgrad = torch.zeros(1, 6, 6, 8)
    sidx = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2]], dtype=torch.int32)
    pairs, out_idx, num = (torch.zeros(27, 2, 2, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int32),
                           torch.zeros(27, dtype=torch.int32))
    h = "handle"
    return {
        "carafe_forward": (mluops.carafe_forward, [h, _carafe_desc(), _d(x, NHWC), x, _d(m, NHWC), m, _d(y, NHWC), y],
                           {0: "handle", 1: "desc", 2: "desc", 3: "data", 4: "desc", 5: "data", 6: "desc", 7: "data"}),
        "carafe_backward": (mluops.carafe_backward,
                            [h, _carafe_desc(), _d(x, NHWC), x, _d(m, NHWC), m, _d(y, NHWC), y.clone(), _d(gx, NHWC),
                             gx, _d(gm, NHWC), gm],
                            {0: "handle", 1: "desc", 2: "desc", 3: "data", 6: "desc", 7: "data", 9: "data",
                             10: "desc", 11: "data"}),
        "set_carafe_descriptor": (mluops.set_carafe_descriptor, [mluops.create_carafe_descriptor(), 4, 3, 1, 2],
                                  {0: "desc", 1: "int", 2: "int", 3: "int", 4: "int"}),
        "get_masked_im2col_forward_workspace_size": (
            mluops.get_masked_im2col_forward_workspace_size, [h, _d(feature, NCHW), _d(idx), _d(idx), 3, 3, _d(col)],
            {0: "handle", 1: "desc", 2: "desc", 3: "desc", 4: "int", 5: "int", 6: "desc"}),
        "masked_im2col_forward": (
            mluops.masked_im2col_forward,
            [h, _d(feature, NCHW), feature, _d(idx), idx, _d(idx), idx, 3, 3, 1, 1, None, 0, _d(col), col],
            {0: "handle", 1: "desc", 2: "data", 3: "desc", 4: "data", 6: "data", 7: "int", 8: "int", 9: "int",
             10: "int", 12: "int", 13: "desc", 14: "data"}),
        "psamask_forward": (mluops.psamask_forward, [h, 0, _d(px, NHWC), px, 3, 3, _d(py, NHWC), py],
                            {0: "handle", 1: "psa_type", 2: "desc", 3: "data", 4: "int", 5: "int", 6: "desc",
                             7: "data"}),
        "psamask_backward": (mluops.psamask_backward, [h, 1, _d(py, NHWC), py.clone(), 3, 3, _d(px, NHWC), px.clone()],
                             {0: "handle", 1: "psa_type", 2: "desc", 3: "data", 4: "int", 5: "int", 6: "desc",
                              7: "data"}),
        "get_psroipool_workspace_size": (mluops.get_psroipool_workspace_size, [h, 2], {0: "handle", 1: "int"}),
        "psroipool_forward": (
            mluops.psroipool_forward,
            [h, 2, 2, 0.5, 2, 2, _d(rx, NHWC), rx, _d(rois), rois, None, 0, _d(rout, NHWC), rout, _d(rmap, NHWC), rmap],
            {0: "handle", 1: "int", 2: "int", 3: "float", 4: "int", 5: "int", 6: "desc", 7: "data", 8: "desc",
             9: "data", 11: "int", 12: "desc", 13: "data", 14: "desc", 15: "data"}),
        "psroipool_backward": (
            mluops.psroipool_backward,
            [h, 2, 2, 0.5, 2, _d(rout, NHWC), rout.clone(), _d(rois), rois, _d(rmap, NHWC), rmap.clone(),
             _d(rgrad, NHWC), rgrad],
            {0: "handle", 1: "int", 2: "int", 3: "float", 4: "int", 5: "desc", 6: "data", 7: "desc", 8: "data",
             9: "desc", 10: "data", 11: "desc", 12: "data"}),
        "set_sparse_convolution_descriptor": (
            mluops.set_sparse_convolution_descriptor,
            [mluops.create_sparse_convolution_descriptor(), 5, 1, [1] * 3, [1] * 3, [1] * 3, [4] * 3, [3] * 3,
             [4] * 3, 1, 0, 0],
            {0: "desc", 1: "int", 2: "int", 3: "ints", 4: "ints", 5: "ints", 6: "ints", 7: "ints", 8: "ints",
             9: "int", 10: "int", 11: "int"}),
        "get_indice_pairs_workspace_size": (
            mluops.get_indice_pairs_workspace_size, [h, _sparse_desc(), _d(sidx), _d(pairs), _d(out_idx), _d(num)],
            {0: "handle", 1: "desc", 2: "desc", 3: "desc", 4: "desc", 5: "desc"}),
        "get_indice_pairs": (
            mluops.get_indice_pairs,
            [h, _sparse_desc(), _d(sidx), sidx, None, 0, _d(pairs), pairs, _d(out_idx), out_idx, _d(num), num],
            {0: "handle", 1: "desc", 2: "desc", 3: "data", 5: "int", 6: "desc", 7: "data", 8: "desc", 9: "data",
             10: "desc", 11: "data"}),
    }


BAD_VALUES = {
    "handle": [None, "handle", 0],
    "int": [None, "3", 3.5, True, [3], object(), float("nan")],
    "ints": [None, "333", 3, [1, "1", 1], [1.5] * 3, [None] * 3],
    "float": [None, "0.5", [0.5], object(), float("nan"), float("inf"), -0.5, 0.0, True],
    "psa_type": [None, "3", 2, -1, 0.5, [0], object()],
    "desc": [None, "desc", torch.zeros(2), 7, object()],
    "data": [None, "data", [[1.0]], 7, torch.zeros(3, 5, 7, dtype=torch.float64)],
}
MLU_NAMES = sorted(_mlu_calls())


def _status(result):
    return result[0] if isinstance(result, tuple) else result


@pytest.mark.parametrize("name", MLU_NAMES)
def test_mluops_every_bad_argument_returns_a_status(name):
    """Each argument of each entry point replaced by each bad value of its kind: a BAD_PARAM or
    NOT_SUPPORTED status (never INTERNAL_ERROR, the fallback for an unchecked argument), the reason
    on the handle, and never an exception."""
    fn, valid, kinds = _mlu_calls()[name]
    handle = mluops.create_handle()
    fix = [handle if a == "handle" else a for a in valid]
    assert _status(fn(*fix)) == Status.SUCCESS, handle.last_error
    failures = []
    for position, kind in kinds.items():
        for bad in BAD_VALUES[kind]:
            fn, valid, _ = _mlu_calls()[name]  # fresh tensors and descriptors each time
            handle = mluops.create_handle()
            args = [handle if a == "handle" else a for a in valid]
            args[position] = bad
            try:
                status = _status(fn(*args))
            except Exception as err:  # noqa: BLE001 -- the point of the test
                failures.append((position, kind, repr(bad)[:20], f"raised {type(err).__name__}: {err}"))
                continue
            if status not in (Status.BAD_PARAM, Status.NOT_SUPPORTED):
                failures.append((position, kind, repr(bad)[:20], status.name, handle.last_error))
            elif kind != "handle" and valid[0] == "handle" and not handle.last_error:
                failures.append((position, kind, repr(bad)[:20], "no reason on the handle"))
    assert not failures, failures


def test_mluops_descriptors_are_validated_and_outputs_may_require_grad():
    for layout, dtype, shape, fragment in ((99, mluops.DataType.FLOAT, (1,), "layout"),
                                           (NHWC, "float", (1,), "dtype"),
                                           (NHWC, mluops.DataType.FLOAT, (1, 2.0), r"shape\[1\]"),
                                           (NHWC, mluops.DataType.FLOAT, None, "shape")):
        with pytest.raises(BadParamError, match=fragment):
            mluops.create_tensor_descriptor(layout, dtype, shape)
    fn, args, _ = _mlu_calls()["psamask_forward"]
    handle = mluops.create_handle()
    args = [handle if a == "handle" else a for a in args]
    args[6] = mluops.create_tensor_descriptor(NHWC, mluops.DataType.FLOAT, (1, 3, -4, 12))  # negative size
    assert fn(*args) == Status.BAD_PARAM and "sizes must be >= 0" in handle.last_error
    # a caller-allocated output that requires grad is written like a plain buffer (C semantics)
    fn, args, _ = _mlu_calls()["psamask_forward"]
    args = [handle if a == "handle" else a for a in args]
    args[7].requires_grad_()
    assert fn(*args) == Status.SUCCESS and args[7].abs().sum() > 0
