"""cvops.mmcv against mmcv.ops's published behaviour.

Signatures: an expected table written from mmcv 2.x's API (always checked) and, where mmcv's Python files
are present (``pip install --no-deps mmcv-lite``; or ``CVOPS_MMCV_SRC=<dir of mmcv>``), the same table
read from mmcv's source with ``ast`` (importing mmcv.ops needs mmengine and its compiled ``_ext``).
Numerics: the formulas of mmcv's kernels, written as loops here, and the properties mmcv's own unit tests
check (gradcheck for CARAFE, masked conv = dense conv at the mask points, PSAMask on PSANet's shapes).
"""
import ast
import importlib.util
import inspect
import os
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import cvops
import cvops.mmcv as mm

# name -> {method: [(parameter, default or NO_DEFAULT)]}; functions use the key "call"
NO_DEFAULT = "<required>"
_CARAFE_ARGS = [("features", NO_DEFAULT), ("masks", NO_DEFAULT), ("kernel_size", NO_DEFAULT),
                ("group_size", NO_DEFAULT), ("scale_factor", NO_DEFAULT)]
EXPECTED = {
    "PSAMask": {"__init__": [("psa_type", NO_DEFAULT), ("mask_size", None)], "forward": [("input", NO_DEFAULT)]},
    "CARAFE": {"__init__": _CARAFE_ARGS[2:], "forward": _CARAFE_ARGS[:2]},
    "CARAFENaive": {"__init__": _CARAFE_ARGS[2:], "forward": _CARAFE_ARGS[:2]},
    "CARAFEPack": {"__init__": [("channels", NO_DEFAULT), ("scale_factor", NO_DEFAULT), ("up_kernel", 5),
                                ("up_group", 1), ("encoder_kernel", 3), ("encoder_dilation", 1),
                                ("compressed_channels", 64)],
                   "forward": [("x", NO_DEFAULT)]},
    "MaskedConv2d": {"__init__": [("in_channels", NO_DEFAULT), ("out_channels", NO_DEFAULT),
                                  ("kernel_size", NO_DEFAULT), ("stride", 1), ("padding", 0), ("dilation", 1),
                                  ("groups", 1), ("bias", True)],
                     "forward": [("input", NO_DEFAULT), ("mask", None)]},
    "carafe": {"call": _CARAFE_ARGS},
    "carafe_naive": {"call": _CARAFE_ARGS},
    "masked_conv2d": {"call": [("features", NO_DEFAULT), ("mask", NO_DEFAULT), ("weight", NO_DEFAULT),
                               ("bias", NO_DEFAULT), ("padding", 0), ("stride", 1)]},
    "DeformConv2d": {"__init__": [("in_channels", NO_DEFAULT), ("out_channels", NO_DEFAULT),
                                  ("kernel_size", NO_DEFAULT), ("stride", 1), ("padding", 0), ("dilation", 1),
                                  ("groups", 1), ("deform_groups", 1), ("bias", False), ("im2col_step", 32)],
                     "forward": [("x", NO_DEFAULT), ("offset", NO_DEFAULT)]},
    "deform_conv2d": {"call": [("input", NO_DEFAULT), ("offset", NO_DEFAULT), ("weight", NO_DEFAULT), ("stride", 1),
                               ("padding", 0), ("dilation", 1), ("groups", 1), ("deform_groups", 1),
                               ("bias", False), ("im2col_step", 32)]},
    "nms": {"call": [("boxes", NO_DEFAULT), ("scores", NO_DEFAULT), ("iou_threshold", NO_DEFAULT), ("offset", 0),
                     ("score_threshold", 0), ("max_num", -1)]},
    "batched_nms": {"call": [("boxes", NO_DEFAULT), ("scores", NO_DEFAULT), ("idxs", NO_DEFAULT),
                             ("nms_cfg", NO_DEFAULT), ("class_agnostic", False)]},
}


def _ours(name: str) -> dict:
    return _table(getattr(mm, name))


def _table(obj) -> dict:
    methods = {"call": obj} if not inspect.isclass(obj) else {m: getattr(obj, m) for m in ("__init__", "forward")}
    table = {}
    for method, fn in methods.items():
        params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
        table[method] = [(p.name, NO_DEFAULT if p.default is inspect.Parameter.empty else p.default) for p in params]
    return table


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_signatures_match_mmcv_api(name):
    assert _ours(name) == EXPECTED[name]
    assert name in mm.__all__


def _mmcv_ops_dir():
    where = os.environ.get("CVOPS_MMCV_SRC")
    if where:
        return Path(where) / "ops"
    try:
        spec = importlib.util.find_spec("mmcv")  # finds the package without importing it
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent / "ops" if spec and spec.origin else None


def _args_of(fn: ast.FunctionDef, skip: int) -> list:
    args = fn.args.args[skip:]
    defaults = [NO_DEFAULT] * (len(args) - len(fn.args.defaults)) + [ast.literal_eval(d) for d in fn.args.defaults]
    return [(a.arg, d) for a, d in zip(args, defaults)]


def _peer_table(ops_dir: Path) -> dict:
    """{name: {method: params}} for our names, from mmcv's psa_mask.py, carafe.py, masked_conv.py, deform_conv.py
    and nms.py."""
    table = {}
    for file in ("psa_mask.py", "carafe.py", "masked_conv.py", "deform_conv.py", "nms.py"):
        tree = ast.parse((ops_dir / file).read_text())
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        methods = {c: {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)} for c, node in classes.items()}
        for c in classes:
            if c in EXPECTED:
                table[c] = {m: _args_of(methods[c][m], 1) for m in ("__init__", "forward")}
        for node in tree.body:  # `carafe = CARAFEFunction.apply`: the Function's forward without ctx
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "apply"):
                table[node.targets[0].id] = {"call": _args_of(methods[node.value.value.id]["forward"], 1)}
            elif isinstance(node, ast.FunctionDef) and node.name in EXPECTED:  # `def nms(...)`
                table[node.name] = {"call": _args_of(node, 0)}
    return table


def test_signatures_match_installed_mmcv():
    ops_dir = _mmcv_ops_dir()
    if ops_dir is None or not (ops_dir / "carafe.py").exists():
        pytest.skip("mmcv's Python files are not installed (pip install --no-deps mmcv-lite)")
    peer = _peer_table(ops_dir)
    assert set(EXPECTED) <= set(peer)
    for name in EXPECTED:
        assert _ours(name) == peer[name], name
    exported = ast.parse((ops_dir / "__init__.py").read_text())
    names = {n.id if isinstance(n, ast.Name) else n.value for node in ast.walk(exported)
             if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__"
             for n in node.value.elts}
    assert set(EXPECTED) <= names  # every name here is an mmcv.ops export
    from cvops.mmcv.psa_mask import psa_mask  # mmcv.ops.psa_mask's function, not exported by mmcv.ops
    assert _table(psa_mask) == peer["psa_mask"]


# ---------------------------------------------------------------------------------------------
# PSAMask: mmcv's CPU kernel, as a loop over feature positions and the mask window

def mmcv_psamask(x: torch.Tensor, distribute: bool, h_mask: int, w_mask: int) -> torch.Tensor:
    n, _, h, w = x.shape
    half_h, half_w = (h_mask - 1) // 2, (w_mask - 1) // 2
    out = x.new_zeros(n, h * w, h, w)
    for i in range(h):
        for j in range(w):
            for hi in range(max(0, half_h - i), min(h_mask, h + half_h - i)):
                for wi in range(max(0, half_w - j), min(w_mask, w + half_w - j)):
                    y, xx = hi + i - half_h, wi + j - half_w
                    if distribute:
                        out[:, i * w + j, y, xx] = x[:, hi * w_mask + wi, i, j]
                    else:
                        out[:, y * w + xx, i, j] = x[:, hi * w_mask + wi, i, j]
    return out


@pytest.mark.parametrize("psa_type", ["collect", "distribute"])
@pytest.mark.parametrize("mask, hw", [((3, 3), (4, 5)), ((5, 4), (3, 6)), ((2, 2), (2, 2)), ((7, 7), (3, 3))])
def test_psamask_matches_mmcv_kernel(psa_type, mask, hw):
    x = torch.randn(2, mask[0] * mask[1], *hw, dtype=torch.float64, requires_grad=True)
    module = mm.PSAMask(psa_type, mask)
    assert module.psa_type_enum == (psa_type == "distribute")
    out = module(x)
    expected = mmcv_psamask(x.detach(), psa_type == "distribute", *mask)
    assert torch.equal(out, expected)
    # the backward is the adjoint: <f(x), g> == <x, f^T(g)>
    g = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, x, g)
    torch.testing.assert_close((expected * g).sum(), (x.detach() * grad).sum())


def test_psamask_repr_and_rejects_unknown_type():
    assert repr(mm.PSAMask("collect", (3, 3))) == "PSAMask(psa_type=collect, mask_size=(3, 3))"
    with pytest.raises(ValueError, match="psa_type"):
        mm.PSAMask("gather", (3, 3))


def test_argument_errors_are_the_assertion_errors_mmcv_raises():
    """mmcv asserts its arguments; cvops.mmcv's BadParamError is that AssertionError too (and still a
    ValueError, which mmcv raises for a masked conv's stride). cvops's own functions stay plain."""
    from cvops.mmcv.psa_mask import psa_mask
    x, mask = torch.randn(1, 4, 5, 5), torch.ones(1, 5, 5)
    calls = {"carafe masks": lambda: mm.carafe(x, torch.rand(1, 9, 9, 9), 3, 1, 2),
             "CARAFE kernel": lambda: mm.CARAFE(4, 1, 2),
             "CARAFE forward masks": lambda: mm.CARAFE(3, 1, 2)(x, torch.rand(1, 9, 9, 9)),
             "PSAMask type": lambda: mm.PSAMask("gather", (3, 3)),
             "PSAMask channels": lambda: mm.PSAMask("collect", (3, 3))(x),
             "psa_mask channels": lambda: psa_mask(x, 0, (3, 3)),
             "MaskedConv2d mask": lambda: mm.MaskedConv2d(4, 2, 3, padding=1)(x, mask[0]),
             "masked_conv2d stride": lambda: mm.masked_conv2d(x, mask, torch.randn(2, 4, 3, 3), None, 1, 2),
             "nms boxes": lambda: mm.nms(torch.rand(3, 3), torch.rand(3), 0.5)}
    for name, call in calls.items():
        with pytest.raises(AssertionError) as caught:
            call()
        assert isinstance(caught.value, cvops.BadParamError) and isinstance(caught.value, ValueError), name
    with pytest.raises(cvops.BadParamError) as native:
        cvops.carafe(x, torch.rand(1, 9, 9, 9), 3, 1, 2)
    assert not isinstance(native.value, AssertionError)


def test_psamask_pspnet_shape():
    x = torch.randn(1, 13 * 13, 9, 9)  # PSANet's mask on a small map
    assert mm.PSAMask("distribute", (13, 13))(x).shape == (1, 81, 9, 9)


# ---------------------------------------------------------------------------------------------
# CARAFE: mmcv's naive kernel formula (zero padding, mask channel (g*k + ky)*k + kx, group of c = c // (C/G))

def mmcv_carafe(x, masks, k, group, s):
    n, c, h, w = x.shape
    half = (k - 1) // 2
    padded = F.pad(x, (half, half, half, half))
    base = padded.repeat_interleave(s, 2).repeat_interleave(s, 3)  # output pixel -> its source pixel's window
    out = x.new_zeros(n, c, h * s, w * s)
    gm = masks.view(n, group, k * k, h * s, w * s).repeat_interleave(c // group, 1)
    for ky in range(k):
        for kx in range(k):
            window = base[:, :, ky * s:ky * s + h * s, kx * s:kx * s + w * s]
            out += window * gm[:, :, ky * k + kx]
    return out


@pytest.mark.parametrize("cls", ["CARAFE", "CARAFENaive"])
@pytest.mark.parametrize("k, group, s, shape", [(3, 1, 2, (2, 3, 4, 5)), (5, 2, 3, (1, 4, 3, 3)), (1, 1, 1, (1, 2, 3, 2))])
def test_carafe_matches_mmcv_kernel(cls, k, group, s, shape):
    n, c, h, w = shape
    x = torch.randn(shape, dtype=torch.float64)
    masks = torch.rand(n, group * k * k, h * s, w * s, dtype=torch.float64)
    expected = mmcv_carafe(x, masks, k, group, s)
    torch.testing.assert_close(getattr(mm, cls)(k, group, s)(x, masks), expected)
    fn = mm.carafe if cls == "CARAFE" else mm.carafe_naive
    torch.testing.assert_close(fn(x.float(), masks.float(), k, group, s), expected.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [mm.carafe, mm.carafe_naive])
def test_carafe_gradcheck(fn):  # mmcv's test_carafe runs gradcheck on both functions (CUDA there)
    x = torch.randn(1, 4, 3, 4, dtype=torch.float64, requires_grad=True)
    masks = torch.rand(1, 2 * 9, 6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b, 3, 2, 2), (x, masks))


def test_carafepack_matches_mmcv_composition():
    torch.manual_seed(0)
    pack = mm.CARAFEPack(8, 2, up_kernel=3, up_group=2, compressed_channels=6).double()
    assert [k for k in pack.state_dict()] == ["channel_compressor.weight", "channel_compressor.bias",
                                              "content_encoder.weight", "content_encoder.bias"]
    assert pack.content_encoder.weight.shape == (3 * 3 * 2 * 4, 6, 3, 3)
    # mmcv's init: xavier-uniform convs with zero bias, then normal(std=0.001) for the content encoder
    bound = (6 / (8 + 6)) ** 0.5
    assert pack.channel_compressor.weight.abs().max() <= bound and not pack.channel_compressor.bias.any()
    assert 0.0005 < pack.content_encoder.weight.std() < 0.002 and not pack.content_encoder.bias.any()
    x = torch.randn(2, 8, 4, 3, dtype=torch.float64)
    mask = F.pixel_shuffle(pack.content_encoder(pack.channel_compressor(x)), 2)
    n, mc, h, w = mask.shape
    mask = F.softmax(mask.view(n, mc // 9, 9, h, w), dim=2).view(n, mc, h, w)
    torch.testing.assert_close(pack(x), mmcv_carafe(x, mask, 3, 2, 2))
    assert pack(x).shape == (2, 8, 8, 6)


# ---------------------------------------------------------------------------------------------
# MaskedConv2d: mmcv computes bias + W * window at mask > 0 and writes zeros elsewhere

@pytest.mark.parametrize("bias", [True, False])
def test_masked_conv2d_equals_dense_conv_at_mask_points(bias):
    torch.manual_seed(0)
    conv = mm.MaskedConv2d(3, 4, 3, padding=1, bias=bias).double()
    x = torch.randn(1, 3, 6, 7, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(1, 6, 7, dtype=torch.float64) - 0.4  # mask > 0 selects, as mmcv's nonzero(mask > 0)
    out = conv(x, mask)
    dense = F.conv2d(x, conv.weight, conv.bias, padding=1) * (mask > 0)
    torch.testing.assert_close(out, dense)
    torch.testing.assert_close(conv(x, torch.ones(1, 6, 7, dtype=torch.float64)), conv(x))  # all points = conv
    # unlike mmcv, the masked path has a backward: the dense conv's gradient at the mask points
    out.square().sum().backward()
    mine = (x.grad.clone(), conv.weight.grad.clone())
    x.grad = None
    conv.zero_grad()
    dense.square().sum().backward()
    torch.testing.assert_close(mine, (x.grad, conv.weight.grad))


def test_masked_conv2d_function_and_no_mask_fallback():
    torch.manual_seed(1)
    x, weight, b = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.randn(3)
    mask = torch.zeros(1, 5, 5)
    mask[0, 1, 2] = mask[0, 4, 0] = 1
    out = mm.masked_conv2d(x, mask, weight, b, 1)
    assert out.shape == (1, 3, 5, 5) and torch.count_nonzero(out.abs().sum(1)) == 2
    torch.testing.assert_close(out[0, :, 1, 2], F.conv2d(x, weight, b, padding=1)[0, :, 1, 2])
    conv = mm.MaskedConv2d(2, 3, 3, stride=2)
    torch.testing.assert_close(conv(x), F.conv2d(x, conv.weight, conv.bias, stride=2))
    with pytest.raises(ValueError, match="stride"):  # mmcv: "Stride could not only be 1 ..."
        mm.masked_conv2d(x, mask, weight, b, 1, 2)
    assert mm.masked_conv2d(x, torch.zeros(1, 5, 5), weight, b, 1).abs().sum() == 0  # no points: zeros


def test_same_objects_as_native_modules():
    assert mm.CARAFEPack is cvops.nn.CARAFEPack and mm.MaskedConv2d is cvops.nn.MaskedConv2d
    assert issubclass(mm.PSAMask, cvops.nn.PSAMask)


MODULE_PATHS = {"carafe": ["CARAFE", "CARAFENaive", "CARAFEPack", "carafe", "carafe_naive"],
                "masked_conv": ["MaskedConv2d", "masked_conv2d"], "psa_mask": ["PSAMask", "psa_mask"]}


@pytest.mark.parametrize("module", sorted(MODULE_PATHS))
def test_names_sit_at_mmcv_module_paths(module):
    """mmcv.ops.<module> paths (mmdet's CARAFE-FPN imports ``from mmcv.ops.carafe import CARAFEPack``): each
    name is there, and the top-level name is the same object where mmcv.ops exports it too."""
    ours = importlib.import_module(f"cvops.mmcv.{module}")
    assert sorted(ours.__all__) == sorted(MODULE_PATHS[module])
    for name in MODULE_PATHS[module]:
        if name in mm.__all__:
            assert getattr(ours, name) is getattr(mm, name)


def test_psa_mask_function_is_the_module_s():
    """mmcv's ``psa_mask(input, psa_type_enum, mask_size)``, as PSAMask calls it, with its gradient."""
    from cvops.mmcv.psa_mask import psa_mask
    x = torch.randn(2, 9, 4, 5, dtype=torch.float64, requires_grad=True)
    for name, enum in (("collect", 0), ("distribute", 1)):
        assert torch.equal(psa_mask(x, enum, 3), mm.PSAMask(name, (3, 3))(x))
    torch.autograd.gradcheck(lambda t: psa_mask(t, 1, (3, 3)), (x,))


def test_module_paths_import_where_cvops_mmcv_stands_in_for_mmcv_ops(monkeypatch):
    """With ``sys.modules["mmcv.ops"] = cvops.mmcv`` (how code that imports mmcv.ops is pointed here), mmdet's
    ``from mmcv.ops.carafe import CARAFEPack`` and the other module paths import and give cvops's classes."""
    stub = types.ModuleType("mmcv")
    stub.__path__ = []
    monkeypatch.setitem(sys.modules, "mmcv", stub)
    monkeypatch.setitem(sys.modules, "mmcv.ops", mm)
    for module in MODULE_PATHS:
        monkeypatch.delitem(sys.modules, f"mmcv.ops.{module}", raising=False)
        # importing mmcv.ops.<module> binds that name on its parent, here cvops.mmcv: its function (carafe)
        # comes back after the test
        monkeypatch.setattr(mm, module, getattr(mm, module))
    try:
        assert importlib.import_module("mmcv.ops.carafe").CARAFEPack is mm.CARAFEPack
        assert importlib.import_module("mmcv.ops.masked_conv").MaskedConv2d is mm.MaskedConv2d
        assert importlib.import_module("mmcv.ops.psa_mask").psa_mask(torch.randn(1, 4, 3, 3), 0, 2).shape == (1, 9, 3, 3)
    finally:
        for module in MODULE_PATHS:
            sys.modules.pop(f"mmcv.ops.{module}", None)
