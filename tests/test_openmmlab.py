"""mmsegmentation, mmdetection and mmdet3d model code, unmodified, on cvops after ``cvops.mmcv.install_as_mmcv()``.

Each component is built from the config file shipped in its package (mmseg's PSAHead of PSANet, mmdet's FPN_CARAFE
neck and GARetinaHead, mmdet3d's SparseEncoder of CenterPoint) and run forward and backward on small inputs; the
cvops ops inside are checked against plain-torch references run in the same network. The packages are
requirements/openmmlab.txt (mmcv-lite: no compiled mmcv), which `make test` installs; without them these tests skip.
"""
from __future__ import annotations

import ast
import subprocess
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import cvops.mmcv

PACKAGES = ("mmengine", "mmcv", "mmseg", "mmdet", "mmdet3d")
_MISSING = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"OpenMMLab packages not installed ({', '.join(_MISSING)}): pip install -r "
                           "requirements/openmmlab-needs.txt && pip install --no-deps -r requirements/openmmlab.txt")


@pytest.fixture(scope="module")
def openmmlab():
    """install_as_mmcv(), then the three model packages imported as a user's script would, mmdet3d without spconv
    (the real one may be installed here, the benchmarks' anchor), so that it takes mmcv's sparse convolutions."""
    cvops.mmcv.install_as_mmcv()
    saved = {k: v for k, v in sys.modules.items() if k == "spconv" or k.startswith("spconv.")}
    sys.modules["spconv"] = None  # `import spconv` raises ImportError
    try:
        import mmdet3d.models  # noqa: F401
        import mmdet.models  # noqa: F401
        import mmseg.models  # noqa: F401
        from mmdet3d.models.layers.spconv import IS_SPCONV2_AVAILABLE
    finally:
        del sys.modules["spconv"]
        sys.modules.update(saved)
    assert not IS_SPCONV2_AVAILABLE


def shipped_config(package: str, path: str):
    from mmengine.config import Config
    return Config.fromfile(str(Path(importlib.import_module(package).__file__).parent / ".mim" / "configs" / path))


def registry(package: str):
    return importlib.import_module(f"{package}.registry").MODELS


# ------------------------------------------------------------------------------------------ imports, registry

def _mmcv_imports(package: str) -> set:
    """(module, name) for every ``from mmcv.ops[.x] import name`` in the package's code."""
    found = set()
    for file in Path(importlib.import_module(package).__file__).parent.rglob("*.py"):
        text = file.read_text(encoding="utf-8")
        if "mmcv.ops" not in text or ".mim" in file.parts:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mmcv.ops"):
                found.update((node.module, alias.name) for alias in node.names)
    return found


@pytest.mark.parametrize("package", ["mmseg", "mmdet", "mmdet3d"])
def test_every_mmcv_ops_name_the_package_imports_resolves(openmmlab, package):
    imports = _mmcv_imports(package)
    assert len(imports) >= 6
    for module, name in sorted(imports):
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_ops_registry_and_placeholders(openmmlab):
    import mmcv.ops
    from mmcv.cnn import build_conv_layer, build_upsample_layer
    from mmengine.registry import MODELS
    from mmcv.ops.carafe import CARAFEPack
    from mmcv.ops.nms import batched_nms
    from mmcv.ops.sparse_structure import SparseConvTensor

    assert CARAFEPack is cvops.mmcv.CARAFEPack and mmcv.ops.CARAFEPack is CARAFEPack
    assert batched_nms is cvops.mmcv.batched_nms and SparseConvTensor is cvops.mmcv.SparseConvTensor
    assert mmcv.ops.nms is cvops.mmcv.nms  # the function, as in mmcv, not the submodule of the same name
    # mmcv's registry names, as mmcv.ops registers them
    assert isinstance(build_upsample_layer(dict(type="carafe", channels=8, scale_factor=2)), cvops.mmcv.CARAFEPack)
    assert isinstance(build_conv_layer(dict(type="DCN"), 4, 8, 3, padding=1), cvops.mmcv.DeformConv2dPack)
    for name in ("SubMConv3d", "SparseConv3d", "SparseInverseConv3d", "SubMConv4d"):
        assert MODELS.get(name) is getattr(cvops.mmcv, name)
    # an op cvops lacks: imports and constructs (keeping its configuration), raises naming the op when called
    layer = mmcv.ops.RoIAlign(output_size=7, spatial_scale=0.25, sampling_ratio=0)
    assert layer.output_size == 7
    with pytest.raises(NotImplementedError, match=r"mmcv\.ops\.RoIAlign: cvops does not provide"):
        layer(torch.zeros(1, 2, 4, 4), torch.zeros(1, 5))
    with pytest.raises(NotImplementedError, match=r"mmcv\.ops\.soft_nms: cvops does not provide"):
        mmcv.ops.soft_nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
    from mmdet3d.models.data_preprocessors.voxelize import ext_module  # loads mmcv._ext itself
    with pytest.raises(NotImplementedError, match=r"mmcv\._ext\.hard_voxelize_forward"):
        ext_module.hard_voxelize_forward()


# ------------------------------------------------------------------------------------------ mmseg: PSAHead

def psamask_by_indexing(x: torch.Tensor, collect: bool, mask_size) -> torch.Tensor:
    """mmcv's PSAMask: mask channel ``hi*w_mask + wi`` at ``(i, j)`` goes to position ``(i + hi - h_mask//2,
    j + wi - w_mask//2)``, as the output's channel (collect) or as the output's position of channel ``i*W + j``."""
    n, _, h, w = x.shape
    h_mask, w_mask = mask_size
    hi, wi, i, j = torch.meshgrid(*(torch.arange(s) for s in (h_mask, w_mask, h, w)), indexing="ij")
    y, xx = i + hi - (h_mask - 1) // 2, j + wi - (w_mask - 1) // 2
    valid = (y >= 0) & (y < h) & (xx >= 0) & (xx < w)
    hi, wi, i, j, y, xx = (t[valid] for t in (hi, wi, i, j, y, xx))
    out = x.new_zeros(n, h * w, h, w)
    if collect:
        out[:, y * w + xx, i, j] = x[:, hi * w_mask + wi, i, j]
    else:
        out[:, i * w + j, y, xx] = x[:, hi * w_mask + wi, i, j]
    return out


def test_psanet_psa_head_forward_backward(openmmlab):
    cfg = shipped_config("mmseg", "psanet/psanet_r50-d8_4xb2-40k_cityscapes-512x1024.py").model.decode_head
    head = registry("mmseg").build(cfg)  # bi-direction: PSAMask collect and distribute, mask 97 x 97
    assert isinstance(head.psamask_collect, cvops.mmcv.PSAMask)
    inputs = [torch.randn(2, c, 12, 10) for c in (256, 512, 1024, 2048)]  # in_index 3: a 96 x 80 image at 1/8

    def run():
        torch.manual_seed(0)  # the same dropout mask in both runs
        x = inputs[3].clone().requires_grad_()
        out = head(inputs[:3] + [x])
        out.square().sum().backward()
        return out.detach(), x.grad, head.conv_seg.weight.grad.clone()

    ours = run()
    head.zero_grad()
    for module, collect in ((head.psamask_collect, True), (head.psamask_distribute, False)):
        module.forward = lambda t, collect=collect: psamask_by_indexing(t, collect, (97, 97))
    reference = run()
    assert ours[0].shape == (2, 19, 12, 10) and ours[1].abs().sum() > 0
    for got, expected in zip(ours, reference):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ mmdet: FPN_CARAFE

def carafe_by_unfold(x: torch.Tensor, masks: torch.Tensor, k: int, group: int, scale: int) -> torch.Tensor:
    """mmcv's CARAFE: output ``(y, x)`` sums the ``k x k`` window around input ``(y // s, x // s)`` (zero outside)
    weighted by mask channels ``g*k*k + ky*k + kx`` of its channel's group ``g``."""
    n, c, h, w = x.shape
    windows = F.unfold(x, k, padding=(k - 1) // 2).view(n, group, c // group, k * k, h, w)
    windows = windows.repeat_interleave(scale, -2).repeat_interleave(scale, -1)
    return (windows * masks.view(n, group, 1, k * k, h * scale, w * scale)).sum(3).view(n, c, h * scale, w * scale)


def test_fpn_carafe_neck_forward_backward(openmmlab):
    cfg = shipped_config("mmdet", "carafe/faster-rcnn_r50_fpn-carafe_1x_coco.py").model.neck
    neck = registry("mmdet").build(cfg).double()  # upsample_cfg type 'carafe': mmcv's registry name
    uppers = [m for m in neck.modules() if isinstance(m, cvops.mmcv.CARAFEPack)]
    assert len(uppers) >= 3
    inputs = [torch.randn(2, c, 32 >> i, 24 >> i, dtype=torch.float64) for i, c in enumerate((256, 512, 1024, 2048))]

    def run():
        x = [t.clone().requires_grad_() for t in inputs]
        outs = neck(x)
        sum((o * o.detach().sign()).sum() for o in outs).backward()
        return [o.detach() for o in outs] + [t.grad for t in x]

    ours = run()
    for m in uppers:
        m.feature_reassemble = lambda x, masks, m=m: carafe_by_unfold(x, masks, m.up_kernel, m.up_group,
                                                                       m.scale_factor)
    reference = run()
    assert [o.shape[-2:] for o in ours[:5]] == [(32, 24), (16, 12), (8, 6), (4, 3), (2, 2)]
    for got, expected in zip(ours, reference):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------------------------------ mmdet: GARetinaHead

def _ga_retina_head():
    cfg = shipped_config("mmdet", "guided_anchoring/ga-retinanet_r50-caffe_fpn_1x_coco.py").model
    head = registry("mmdet").build(dict(cfg.bbox_head, train_cfg=cfg.train_cfg, test_cfg=cfg.test_cfg))
    torch.manual_seed(0)
    for module in head.modules():  # random weights that give real detections and a partial location mask
        if isinstance(module, torch.nn.Conv2d | cvops.mmcv.DeformConv2d):
            torch.nn.init.normal_(module.weight, std=0.05)
    torch.nn.init.constant_(head.conv_loc.bias, -4.6)  # sigmoid = loc_filter_thr (0.01): about half pass
    torch.nn.init.zeros_(head.retina_cls.bias)
    return head


def _image(size: int):
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    sample = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size), scale_factor=(1.0, 1.0),
                                         pad_shape=(size, size), batch_input_shape=(size, size)))
    sample.gt_instances = InstanceData(bboxes=torch.tensor([[6.0, 10, 40, 50], [30, 24, 60, 62]]),
                                       labels=torch.tensor([3, 7]))
    features = tuple(torch.randn(1, 256, -(-size // s), -(-size // s)) for s in (8, 16, 32, 64, 128))
    return features, [sample]


def test_ga_retinanet_head_predict_and_train(openmmlab):
    head = _ga_retina_head()
    assert isinstance(head.retina_cls, cvops.mmcv.MaskedConv2d)
    assert isinstance(head.feature_adaption_cls.conv_adaption, cvops.mmcv.DeformConv2d)
    features, samples = _image(64)
    calls = []
    head.retina_cls.register_forward_hook(lambda m, args, out: calls.append((m, *args, out)))
    head.eval()
    with torch.no_grad():
        ours = head.predict(features, samples)[0]  # DeformConv2d, MaskedConv2d with the location mask, batched_nms
    assert len(calls) == 5 and 0 < len(ours.scores) <= 100
    partial = 0
    for module, x, mask, out in calls:  # the masked conv: the convolution at the mask, exactly 0 elsewhere
        dense = F.conv2d(x, module.weight, module.bias, padding=1)
        at = mask[0] > 0
        partial += bool(at.any() and not at.all())
        torch.testing.assert_close(out[0][:, at], dense[0][:, at], rtol=1e-4, atol=1e-5)
        assert not out[0][:, ~at].any()
    assert partial >= 1
    for conv in (head.retina_cls, head.retina_reg):  # the same head with dense convolutions
        conv.forward = lambda x, mask=None, conv=conv: F.conv2d(x, conv.weight, conv.bias, padding=1)
    with torch.no_grad():
        dense = head.predict(features, samples)[0]
    assert torch.equal(ours.labels, dense.labels)
    torch.testing.assert_close(ours.bboxes, dense.bboxes, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(ours.scores, dense.scores, rtol=1e-4, atol=1e-5)

    head = _ga_retina_head().train()  # training: MaskedConv2d unmasked, DeformConv2d's backward
    losses = head.loss(features, samples)
    sum(sum(v) if isinstance(v, list) else v for v in losses.values()).backward()
    for module in (head.feature_adaption_cls, head.feature_adaption_reg):
        for grad in (module.conv_adaption.weight.grad, module.conv_offset.weight.grad):
            assert torch.isfinite(grad).all() and grad.abs().sum() > 0


# ------------------------------------------------------------------------------------------ mmdet3d: SparseEncoder

def test_centerpoint_sparse_encoder_every_conv_matches_dense(openmmlab):
    """CenterPoint's nuScenes SparseEncoder on mmcv's sparse path: every sparse convolution's output, at its active
    sites, equals a dense 3-D convolution of its input (mmcv weight layout [*kernel, in, out])."""
    cfg = shipped_config("mmdet3d", "centerpoint/centerpoint_voxel01_second_secfpn_8xb4-cyclic-20e_nus-3d.py")
    cfg = cfg.model.pts_middle_encoder
    cfg.sparse_shape = [41, 24, 24]  # the config's 41 x 1024 x 1024 grid, cropped so the dense check stays cheap
    encoder = registry("mmdet3d").build(cfg).double()
    convs = [m for m in encoder.modules() if isinstance(m, cvops.mmcv.SparseConvolution)]
    assert {type(m).__name__ for m in convs} == {"SubMConv3d", "SparseConv3d"} and len(convs) >= 15
    checked = []

    def check(conv, args, out):
        x = args[0]
        weight = conv.weight.permute(4, 3, 0, 1, 2)
        padding = tuple(d * (k // 2) for k, d in zip(conv.kernel_size, conv.dilation)) if conv.subm else conv.padding
        stride = (1, 1, 1) if conv.subm else conv.stride
        dense = F.conv3d(x.dense(), weight, conv.bias, stride, padding, conv.dilation)
        at = out.indices.long()
        torch.testing.assert_close(out.features, dense[at[:, 0], :, at[:, 1], at[:, 2], at[:, 3]],
                                   rtol=1e-10, atol=1e-10)
        checked.append(conv)

    for conv in convs:
        conv.register_forward_hook(check)
    g = torch.Generator().manual_seed(0)
    sites = torch.stack([torch.randint(0, n, (400,), generator=g) for n in (2, 41, 24, 24)], 1)
    sites = torch.unique(sites, dim=0).int()  # (batch, z, y, x)
    features = torch.randn(len(sites), 5, generator=g, dtype=torch.float64, requires_grad=True)
    out = encoder(features, sites, 2)
    assert out.shape == (2, 256, 3, 3) and len(checked) == len(convs)
    out.square().sum().backward()
    assert features.grad.abs().sum() > 0
    assert all(torch.isfinite(c.weight.grad).all() and c.weight.grad.abs().sum() > 0 for c in convs)


# ------------------------------------------------------------------------------------------ config-driven tools

def test_custom_imports_one_liner_in_a_config(tmp_path):
    """A fresh process as mmdet's tools/train.py runs it: the config's ``custom_imports`` entry installs cvops
    before the registry imports mmdet's model code; the CARAFE-FPN neck of the shipped config builds and runs."""
    shipped = Path(importlib.util.find_spec("mmdet").origin).parent / ".mim" / "configs" / "carafe"
    config = tmp_path / "faster-rcnn_carafe_on_cvops.py"
    config.write_text(f"_base_ = {str(shipped / 'faster-rcnn_r50_fpn-carafe_1x_coco.py')!r}\n"
                      "custom_imports = dict(imports=['cvops.mmcv.install'], allow_failed_imports=False)\n")
    script = f"""
import sys, torch
from mmengine.config import Config
cfg = Config.fromfile({str(config)!r})
from mmdet.registry import MODELS
neck = MODELS.build(cfg.model.neck)
outs = neck([torch.randn(1, c, 16 >> i, 16 >> i) for i, c in enumerate((256, 512, 1024, 2048))])
print(type(neck.upsample_modules[0]).__module__, sys.modules['mmcv.ops'].__doc__, [tuple(o.shape) for o in outs])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == ("cvops.nn mmcv.ops served by cvops (cvops.mmcv.install_as_mmcv) "
                                          "[(1, 256, 16, 16), (1, 256, 8, 8), (1, 256, 4, 4), (1, 256, 2, 2), "
                                          "(1, 256, 1, 1)]")
