"""Bad input at every public entry point: each class of bad argument (wrong type, dtype, rank, shapes,
impossible sizes, non-finite values where they are rejected, bad layout/backend strings, mixed
devices) raises the exact cvops exception naming the argument, on every backend, and the MLU-OPS
layer returns a status instead of raising."""
from __future__ import annotations

import pytest
import torch

import cvops
import cvops.mmcv as mmcv
import cvops.spconv as spconv
import cvops.torchvision as tv
from cvops._core.errors import BadParamError, NotSupportedError
from cvops.mmcv.psa_mask import psa_mask  # cvops.mmcv.psa_mask is the module, as mmcv.ops.psa_mask
from tests.conftest import requires_triton

BACKENDS = ["reference", "torch", pytest.param("numba", marks=pytest.mark.skipif(
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


# ------------------------------------------------------------------------------------------ functional API
META = torch.device("meta")


def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(shape, device=device).to(dtype) if dtype.is_floating_point else \
        torch.zeros(shape, dtype=dtype, device=device)


_X9 = _t(1, 9, 4, 4)
_IDX = torch.tensor([0, 1, 2])
_PS_IN, _PS_ROIS = _t(1, 8, 6, 6), torch.tensor([[0.0, 0, 0, 4, 4]])
_CF_X, _CF_M = _t(1, 4, 3, 3), _t(1, 9, 6, 6)

_SIDX = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2]], dtype=torch.int32)
_SF = _t(2, 4)


def _sites(rows=((0, 1, 1, 1), (0, 2, 2, 2))):
    """A spconv tensor of 4 channels on ``rows`` of a 4^3 grid, batch size 1."""
    return spconv.SparseConvTensor(_t(len(rows), 4), torch.tensor(rows, dtype=torch.int32), [4] * 3, 1)


def _spconv_pairs(ksize, stride, padding):
    return spconv.ops.get_indice_pairs(_SIDX, 1, [4] * 3, None, ksize, stride, padding, 1, 0)


# (id, call(backend), exception or (cvops exception, peer's exception), message fragment)
MMCV_ERROR = (BadParamError, AssertionError)
FUNCTIONAL_CASES = [
    # psamask
    ("psamask dtype", lambda b: cvops.psamask(_t(1, 9, 4, 4, dtype=torch.int64), "collect", 3, backend=b),
     BadParamError, "input dtype"),
    ("psamask rank", lambda b: cvops.psamask(_t(9, 4, 4), "collect", 3, backend=b), BadParamError, "input must be 4-D"),
    ("psamask channels", lambda b: cvops.psamask(_t(1, 5, 4, 4), "collect", 3, backend=b), BadParamError,
     "input channels"),
    ("psamask type", lambda b: cvops.psamask("x", "collect", 3, backend=b), BadParamError, "input must be a torch"),
    ("psamask mask_size 0", lambda b: cvops.psamask(_X9, "collect", 0, backend=b), BadParamError, "mask_size"),
    ("psamask mask_size str", lambda b: cvops.psamask(_X9, "collect", "3", backend=b), BadParamError, "mask_size"),
    ("psamask psa_type", lambda b: cvops.psamask(_X9, None, 3, backend=b), BadParamError, "psa_type"),
    ("psamask layout", lambda b: cvops.psamask(_X9, "collect", 3, "nchw ", backend=b), BadParamError, "layout"),
    ("psamask backward shape", lambda b: cvops.psamask_backward(_t(1, 15, 4, 4), "collect", 3, backend=b),
     BadParamError, "grad_output channels"),
    # carafe
    ("carafe dtype", lambda b: cvops.carafe(_CF_X.int(), _CF_M, 3, 1, 2, backend=b), BadParamError, "features dtype"),
    ("carafe dtypes differ", lambda b: cvops.carafe(_CF_X, _CF_M.double(), 3, 1, 2, backend=b), BadParamError,
     "masks dtype"),
    ("carafe rank", lambda b: cvops.carafe(_CF_X[0], _CF_M, 3, 1, 2, backend=b), BadParamError, "features must be 4-D"),
    ("carafe mask shape", lambda b: cvops.carafe(_CF_X, _t(1, 9, 6, 5), 3, 1, 2, backend=b), BadParamError,
     "masks spatial size"),
    ("carafe mask channels", lambda b: cvops.carafe(_CF_X, _t(1, 8, 6, 6), 3, 1, 2, backend=b), BadParamError,
     "masks channels"),
    ("carafe k even", lambda b: cvops.carafe(_CF_X, _CF_M, 2, 1, 2, backend=b), BadParamError, "odd"),
    ("carafe k 0", lambda b: cvops.carafe(_CF_X, _CF_M, 0, 1, 2, backend=b), BadParamError, "kernel_size"),
    ("carafe s -1", lambda b: cvops.carafe(_CF_X, _CF_M, 3, 1, -1, backend=b), BadParamError, "scale_factor"),
    ("carafe G 3", lambda b: cvops.carafe(_CF_X, _CF_M, 3, 3, 2, backend=b), BadParamError, "divisible by group_size"),
    ("carafe k float", lambda b: cvops.carafe(_CF_X, _CF_M, 3.0, 1, 2, backend=b), BadParamError, "kernel_size"),
    ("carafe layout", lambda b: cvops.carafe(_CF_X, _CF_M, 3, 1, 2, "HWC", backend=b), BadParamError, "layout"),
    ("carafe device", lambda b: cvops.carafe(_CF_X, _CF_M.to(META), 3, 1, 2, backend=b), BadParamError, "device"),
    ("carafe_naive dtype", lambda b: cvops.carafe_naive(_CF_X.bool(), _CF_M, 3, 1, 2, backend=b), BadParamError,
     "features dtype"),
    ("carafe backward shape", lambda b: cvops.carafe_backward(_t(1, 4, 6, 5), _CF_X, _CF_M, 3, 1, 2, backend=b),
     BadParamError, "grad_output shape"),
    # masked_im2col / col2im / conv
    ("im2col dtype", lambda b: cvops.masked_im2col(_X9.int(), _IDX, _IDX, 3, 1, backend=b), BadParamError,
     "feature dtype"),
    ("im2col index dtype", lambda b: cvops.masked_im2col(_X9, _IDX.float(), _IDX, 3, 1, backend=b), BadParamError,
     "mask_h_idx dtype"),
    ("im2col index rank", lambda b: cvops.masked_im2col(_X9, _IDX[None], _IDX, 3, 1, backend=b), BadParamError,
     "mask_h_idx must be 1-D"),
    ("im2col index lengths", lambda b: cvops.masked_im2col(_X9, _IDX, _IDX[:2], 3, 1, backend=b), BadParamError,
     "one length"),
    ("im2col batch", lambda b: cvops.masked_im2col(_t(2, 9, 4, 4), _IDX, _IDX, 3, 1, backend=b), BadParamError,
     "feature batch"),
    ("im2col empty", lambda b: cvops.masked_im2col(_t(1, 0, 4, 4), _IDX, _IDX, 3, 1, backend=b), BadParamError,
     "feature must not be empty"),
    ("im2col kernel 0", lambda b: cvops.masked_im2col(_X9, _IDX, _IDX, 0, 1, backend=b), BadParamError,
     "kernel_size must be >= 1"),
    ("im2col padding overflow", lambda b: cvops.masked_im2col(_X9, _IDX, _IDX, 3, -2**63, backend=b), BadParamError,
     "pad_h"),
    ("im2col padding str", lambda b: cvops.masked_im2col(_X9, _IDX, _IDX, 3, "1", backend=b), BadParamError,
     "padding must be an int"),
    ("im2col device", lambda b: cvops.masked_im2col(_X9, _IDX.to(META), _IDX.to(META), 3, 1, backend=b),
     BadParamError, "device"),
    ("col2im height", lambda b: cvops.masked_col2im(_t(2, 3), _IDX, _IDX, -1, 4, backend=b), BadParamError,
     "height must be >= 0"),
    ("col2im columns", lambda b: cvops.masked_col2im(_t(2, 4), _IDX, _IDX, 4, 4, backend=b), BadParamError,
     "masked_output dim 1"),
    ("conv bias length", lambda b: cvops.masked_conv2d(_t(1, 2, 5, 5), torch.ones(1, 5, 5), _t(3, 2, 3, 3),
                                                       _t(4), 1, backend=b), BadParamError, "bias must have"),
    ("conv weight rank", lambda b: cvops.masked_conv2d(_t(1, 2, 5, 5), torch.ones(1, 5, 5), _t(3, 2, 3), None, 1,
                                                       backend=b), BadParamError, "weight must be 4-D"),
    # psroipool
    ("psroi dtype", lambda b: cvops.psroi_pool(_PS_IN.int(), _PS_ROIS, 2, 2, 1.0, 2, 2, backend=b), BadParamError,
     "input dtype"),
    ("psroi rois shape", lambda b: cvops.psroi_pool(_PS_IN, _PS_ROIS[:, :4], 2, 2, 1.0, 2, 2, backend=b),
     BadParamError, "rois"),
    ("psroi channels", lambda b: cvops.psroi_pool(_PS_IN, _PS_ROIS, 2, 2, 1.0, 2, 3, backend=b), BadParamError,
     "channels"),
    ("psroi scale", lambda b: cvops.psroi_pool(_PS_IN, _PS_ROIS, 2, 2, 0.0, 2, 2, backend=b), BadParamError,
     "spatial_scale"),
    ("psroi pooled 0", lambda b: cvops.psroi_pool(_PS_IN, _PS_ROIS, 0, 2, 1.0, 2, 2, backend=b), BadParamError,
     "pooled"),
    ("psroi batch index", lambda b: cvops.psroi_pool(_PS_IN, torch.tensor([[1.0, 0, 0, 4, 4]]), 2, 2, 1.0, 2, 2,
                                                     backend=b), BadParamError, "batch"),
    # get_indice_pairs
    ("gip dtype", lambda b: cvops.get_indice_pairs(torch.zeros(2, 4), 1, [4] * 3, 3, 1, 1, backend=b), BadParamError,
     "indices"),
    ("gip columns", lambda b: cvops.get_indice_pairs(torch.zeros(2, 3, dtype=torch.int32), 1, [4] * 3, 3, 1, 1,
                                                     backend=b), BadParamError, "indices"),
    ("gip batch 0", lambda b: cvops.get_indice_pairs(torch.zeros(2, 4, dtype=torch.int32), 0, [4] * 3, 3, 1, 1,
                                                     backend=b), BadParamError, "batch"),
    ("gip kernel 0", lambda b: cvops.get_indice_pairs(torch.zeros(2, 4, dtype=torch.int32), 1, [4] * 3, 0, 1, 1,
                                                      backend=b), BadParamError, "kernel"),
    ("gip stride str", lambda b: cvops.get_indice_pairs(torch.zeros(2, 4, dtype=torch.int32), 1, [4] * 3, 3, "1", 1,
                                                        backend=b), BadParamError, "stride"),
    # drop-in namespaces: they run the default backend (CVOPS_NUMBA picks the CPU one) and ignore the backend string
    ("spconv indices dtype", lambda b: spconv.SparseConvTensor(_SF, _SIDX.float(), [4] * 3, 1), BadParamError,
     "indices dtype"),
    ("spconv indices rank", lambda b: spconv.SparseConvTensor(_SF, _SIDX[:, 0], [4] * 3, 1), BadParamError,
     "indices must be 2-D"),
    ("spconv indices width", lambda b: spconv.SparseConvTensor(_SF, _SIDX[:, :3], [4] * 3, 1), BadParamError,
     r"indices must be \[N, 4\]"),
    ("spconv batch index", lambda b: spconv.SubMConv3d(4, 2, 3)(_sites([[0, 1, 1, 1], [1, 2, 2, 2]])), BadParamError,
     "indices batch"),
    ("spconv negative coordinate", lambda b: spconv.SparseConv3d(4, 2, 3)(_sites([[0, 1, 1, 1], [0, -1, 2, 2]])),
     BadParamError, "indices coordinate 0"),
    ("spconv 1x1 layer batch index", lambda b: spconv.SubMConv3d(4, 2, 1)(_sites([[0, 1, 1, 1], [3, 9, 2, 2]])),
     BadParamError, "indices batch"),
    ("spconv 1x1 layer off the grid", lambda b: spconv.SparseConv3d(4, 2, 1)(_sites([[0, 1, 1, 1], [0, 1, 99, 2]])),
     BadParamError, "indices coordinate 1"),
    ("spconv subm duplicate site", lambda b: spconv.SubMConv3d(4, 2, 3)(_sites([[0, 1, 1, 1]] * 2)), BadParamError,
     "duplicate"),
    ("spconv SubMConv3d channels", lambda b: spconv.SubMConv3d(3, 2, 3)(_sites()), BadParamError, "4 channels"),
    ("spconv SparseConv3d channels", lambda b: spconv.SparseConv3d(5, 2, 3)(_sites()), BadParamError, "4 channels"),
    ("spconv layer ndim", lambda b: spconv.SparseConv2d(4, 2, 3)(_sites()), BadParamError, "input is 3-D"),
    ("spconv gip ksize 0", lambda b: _spconv_pairs(0, 1, 0), BadParamError, "kernel_size must be >= 1"),
    ("spconv gip ksize length", lambda b: _spconv_pairs([3, 3], 1, 0), BadParamError, "ksize must be an int or 3"),
    ("spconv gip stride 0", lambda b: _spconv_pairs(3, 0, 0), BadParamError, "stride must be >= 1"),
    ("spconv gip stride str", lambda b: _spconv_pairs(3, "1", 0), BadParamError, "stride must be an int"),
    ("spconv gip padding", lambda b: _spconv_pairs(3, 1, -1), BadParamError, "padding must be >= 0"),
    # torchvision's own exception types as well: AssertionError for the boxes' shape, RuntimeError for the rest
    ("tv boxes shape", lambda b: tv.ps_roi_pool(_PS_IN, _PS_ROIS[:, :4], 2), (BadParamError, AssertionError),
     r"boxes must be a Tensor\[K, 5\]"),
    ("tv boxes list shape", lambda b: tv.ps_roi_pool(_PS_IN, [_PS_ROIS], 2), (BadParamError, AssertionError),
     r"boxes\[0\] must be \[L, 4\]"),
    ("tv output_size channels", lambda b: tv.ps_roi_pool(_PS_IN, _PS_ROIS, 3), (BadParamError, RuntimeError),
     "multiple of output_size"),
    ("tv output_size 0", lambda b: tv.ps_roi_pool(_PS_IN, _PS_ROIS, 0), (BadParamError, RuntimeError),
     "output_size must be positive"),
    ("tv output_size float", lambda b: tv.ps_roi_pool(_PS_IN, _PS_ROIS, 2.0), (BadParamError, RuntimeError),
     "output_size must be an int"),
    ("tv spatial_scale", lambda b: tv.ps_roi_pool(_PS_IN, _PS_ROIS, 2, -1.0), (BadParamError, RuntimeError),
     "spatial_scale"),
    ("tv input rank", lambda b: tv.ps_roi_pool(_PS_IN[0], _PS_ROIS, 2), (BadParamError, RuntimeError),
     "input must be a 4-D"),
    ("tv batch index", lambda b: tv.ps_roi_pool(_PS_IN, _PS_ROIS + 1, 2), (BadParamError, RuntimeError), "batch"),
    ("tv PSRoIPool channels", lambda b: tv.PSRoIPool(3, 1.0)(_PS_IN, _PS_ROIS), (BadParamError, RuntimeError),
     "multiple of output_size"),
    ("tv PSRoIPool spatial_scale", lambda b: tv.PSRoIPool(2, float("nan"))(_PS_IN, _PS_ROIS),
     (BadParamError, RuntimeError), "spatial_scale"),
    # mmcv asserts these: an AssertionError as well (a masked conv's stride is a ValueError there, as BadParamError is)
    ("mmcv carafe masks channels", lambda b: mmcv.carafe(_CF_X, _CF_M[:, :8], 3, 1, 2), MMCV_ERROR,
     "masks channels"),
    ("mmcv carafe scale_factor", lambda b: mmcv.carafe(_CF_X, _CF_M, 3, 1, 3), MMCV_ERROR, "masks spatial size"),
    ("mmcv carafe_naive kernel", lambda b: mmcv.carafe_naive(_CF_X, _CF_M, 2, 1, 2), MMCV_ERROR, "odd"),
    ("mmcv CARAFE masks", lambda b: mmcv.CARAFE(3, 1, 2)(_CF_X, _CF_M[..., :5]), MMCV_ERROR, "masks spatial size"),
    ("mmcv CARAFEPack group", lambda b: mmcv.CARAFEPack(4, 2, up_group=3), BadParamError, "divisible by up_group"),
    ("mmcv CARAFEPack channels", lambda b: mmcv.CARAFEPack(8, 2)(_CF_X), BadParamError, "channels=8"),
    ("mmcv MaskedConv2d channels", lambda b: mmcv.MaskedConv2d(3, 4, 3)(_t(1, 2, 5, 5), torch.ones(1, 5, 5)),
     MMCV_ERROR, "input channels"),
    ("mmcv MaskedConv2d mask", lambda b: mmcv.MaskedConv2d(2, 4, 3)(_t(1, 2, 5, 5), torch.ones(1, 4, 5)),
     MMCV_ERROR, "mask spatial size"),
    ("mmcv MaskedConv2d batch", lambda b: mmcv.MaskedConv2d(2, 4, 3)(_t(2, 2, 5, 5), torch.ones(2, 5, 5)),
     MMCV_ERROR, "input batch"),
    ("mmcv MaskedConv2d stride", lambda b: mmcv.MaskedConv2d(2, 4, 3, stride=2)(_t(1, 2, 5, 5), torch.ones(1, 5, 5)),
     MMCV_ERROR, "stride must be 1"),
    ("mmcv psa_mask channels", lambda b: psa_mask(_t(1, 8, 4, 4), 0, 3), MMCV_ERROR, "input channels"),
    ("mmcv psa_mask type", lambda b: psa_mask(_X9, 2, 3), MMCV_ERROR, "psa_type"),
    ("mmcv psa_mask size", lambda b: psa_mask(_X9, 0, (3, 0)), MMCV_ERROR, "mask_size"),
    ("mmcv PSAMask rank", lambda b: mmcv.PSAMask("collect", 3)(_X9[0]), MMCV_ERROR, "input must be 4-D"),
    ("mmcv PSAMask no mask_size", lambda b: mmcv.PSAMask("distribute")(_X9), MMCV_ERROR, "mask_size"),
    # every op: backend strings
    ("backend name", lambda b: cvops.psamask(_X9, "collect", 3, backend="gpu"), BadParamError, "backend"),
    ("backend name carafe", lambda b: cvops.carafe(_CF_X, _CF_M, 3, 1, 2, backend="cuda"), BadParamError, "backend"),
    ("backend name im2col", lambda b: cvops.masked_im2col(_X9, _IDX, _IDX, 3, 1, backend=3), BadParamError, "backend"),
    ("backend name psroi", lambda b: cvops.psroi_pool(_PS_IN, _PS_ROIS, 2, 2, 1.0, 2, 2, backend="Reference"),
     BadParamError, "backend"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", FUNCTIONAL_CASES, ids=lambda case: case[0])
def test_functional_bad_input_raises_before_any_kernel(case, backend):
    _, call, error, fragment = case
    errors = error if isinstance(error, tuple) else (error,)
    with pytest.raises(errors[0], match=fragment) as info:
        call(backend)
    if len(errors) == 1:
        assert type(info.value) is error
    else:  # a drop-in's error is both the cvops one and its peer's, with the same message
        assert all(isinstance(info.value, e) for e in errors), type(info.value).__mro__


# ------------------------------------------------------------------------------------------ modules' forward, sparse
import cvops.sparse as sp  # noqa: E402

MODULE_FORWARD_CASES = [
    ("CARAFE masks", lambda: cvops.nn.CARAFE(3, 1, 2)(_CF_X, _t(1, 9, 5, 6)), "masks spatial size"),
    ("CARAFENaive dtype", lambda: cvops.nn.CARAFENaive(3, 1, 2)(_CF_X.half(), _CF_M), "masks dtype"),
    ("PSAMask channels", lambda: cvops.nn.PSAMask("collect", 3)(_t(1, 8, 4, 4)), "input channels"),
    ("PSAMask rank", lambda: cvops.nn.PSAMask("collect", 3)(_t(9, 4, 4)), "input must be 4-D"),
    ("MaskedConv2d mask shape", lambda: cvops.nn.MaskedConv2d(2, 3, 3, padding=1)(_t(1, 2, 5, 5), torch.ones(1, 4, 5)),
     "mask spatial size"),
    ("MaskedConv2d channels", lambda: cvops.nn.MaskedConv2d(3, 3, 3)(_t(1, 2, 5, 5), torch.ones(1, 5, 5)),
     "input channels"),
    ("PSRoIPool boxes", lambda: cvops.nn.PSRoIPool(2, 1.0)(_PS_IN, [torch.zeros(1, 3)]), r"boxes\[0\]"),
    ("PSRoIPool rois type", lambda: cvops.nn.PSRoIPool(2, 1.0)(_PS_IN, "rois"), "rois"),
    ("SparseConvTensor indices dtype", lambda: sp.SparseConvTensor(_SF, _SIDX.float(), [4] * 3, 1), "indices dtype"),
    ("SparseConvTensor rows", lambda: sp.SparseConvTensor(_SF[:1], _SIDX, [4] * 3, 1), "indices rows"),
    ("SparseConvTensor batch 0", lambda: sp.SparseConvTensor(_SF, _SIDX, [4] * 3, 0), "batch_size"),
    ("SparseConvTensor spatial", lambda: sp.SparseConvTensor(_SF, _SIDX, [4, -1, 4], 1), "spatial_shape"),
    ("SubMConv3d kernel 0", lambda: sp.SubMConv3d(4, 8, 0), "kernel_size must be >= 1"),
    ("SparseConv3d channels 0", lambda: sp.SparseConv3d(0, 8, 3), "in_channels must be >= 1"),
    ("SparseConv3d stride 0", lambda: sp.SparseConv3d(4, 8, 3, stride=0), "stride must be >= 1"),
    ("SubMConv3d input channels", lambda: sp.SubMConv3d(3, 8, 3, padding=1)(sp.SparseConvTensor(_SF, _SIDX, [4] * 3, 1)),
     "channels"),
    ("SubMConv3d dense input", lambda: sp.SubMConv3d(4, 8, 3)(_SF), "SparseConvTensor"),
]


@pytest.mark.parametrize("case", MODULE_FORWARD_CASES, ids=[c[0] for c in MODULE_FORWARD_CASES])
def test_modules_and_sparse_bad_input(case):
    _, call, fragment = case
    with pytest.raises(BadParamError, match=fragment):
        call()
