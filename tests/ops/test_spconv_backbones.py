"""Detection backbones (SECOND VoxelBackBone8x / VoxelResBackBone8x, PartA2 UNetV2, mmdet3d SparseEncoder)
through ``cvops.spconv``: one training step each, and against spconv 2.x on CPU (single-threaded: its
CPU results change between runs on more threads) with spconv's state_dict loaded unchanged: output sites
equal as sets, outputs and every gradient within 1e-4 (float32, eval-mode BatchNorm) / 1e-10 (float64,
train mode) of the tensor's scale (``max(1, max |ref|)``)."""
from __future__ import annotations

import pytest
import torch

import cvops.spconv as cvspconv
from tests.ops._spconv_backbones import BACKBONES, lidar_input
from tests.support.anchors import spconv_pytorch

GRID = (41, 64, 56)
VOXELS, BATCH = 1200, 2


requires_spconv = pytest.mark.skipif(spconv_pytorch() is None, reason="spconv not installed")


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


def _run(lib, net, features, indices, dtype):
    leaf = features.to(dtype).clone().requires_grad_()
    x = lib.SparseConvTensor(leaf, indices, list(GRID), BATCH)
    outs = _outputs(net(x))
    loss = 0
    for o in outs:  # a fixed weight per (site, channel), whatever the row order
        if isinstance(o, torch.Tensor):
            f, key = o.reshape(o.shape[0], -1), torch.arange(o[0].numel(), dtype=dtype)[None]
        else:
            f, key = o.features, _site_key(o.indices).to(dtype)[:, None]
        loss = loss + (f * torch.sin(0.37 * key + 0.7 * torch.arange(f.shape[1], dtype=dtype))).sum()
    loss.backward()
    return outs, leaf.grad


def _site_key(indices):
    key = indices.long()
    return ((key[:, 0] * 4096 + key[:, 1]) * 4096 + key[:, 2]) * 4096 + key[:, 3]


def _by_site(o):
    """Rows ordered by site (dense outputs as they are)."""
    if isinstance(o, torch.Tensor):
        return None, o
    order = torch.argsort(_site_key(o.indices))
    return o.indices[order], o.features[order]


@pytest.mark.parametrize("name", list(BACKBONES))
def test_backbone_trains_one_step(name):
    features, indices = lidar_input(VOXELS, BATCH, GRID, seed=1)
    torch.manual_seed(0)
    net = BACKBONES[name](cvspconv).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = {k: v.detach().clone() for k, v in net.state_dict().items()}
    outs, grad = _run(cvspconv, net, features, indices, torch.float32)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    for p in net.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()
    opt.step()
    changed = [k for k, v in net.state_dict().items() if k.endswith("weight") and not torch.equal(v, before[k])]
    assert len(changed) == sum(1 for k in before if k.endswith("weight"))
    assert any(not torch.equal(v, before[k]) for k, v in net.state_dict().items() if "running_mean" in k)


@requires_spconv
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float64, 1e-10)])
@pytest.mark.parametrize("name", list(BACKBONES))
def test_backbone_matches_spconv(name, dtype, tol):
    spt = spconv_pytorch()
    features, indices = lidar_input(VOXELS, BATCH, GRID, seed=2)
    torch.manual_seed(0)
    # float32 runs in eval mode: in train mode BatchNorm over the few sites of the deep stages makes the
    # float32 gradients ill-conditioned (both spconv's and cvops's float32 gradients are ~1e0 away from
    # the float64 result there, while the two float64 results agree to 1e-13)
    train = dtype == torch.float64
    ref = BACKBONES[name](spt).to(dtype).train(train)
    net = BACKBONES[name](cvspconv).to(dtype).train(train)
    for m in ref.modules():  # spconv's CPU convs refuse a bias outside training mode: keep the convs training
        if isinstance(m, spt.conv.SparseConvolution):
            m.train()
    net.load_state_dict(ref.state_dict())  # a spconv 2.x checkpoint loads unchanged
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref_outs, ref_grad = _run(spt, ref, features, indices, dtype)
    finally:
        torch.set_num_threads(threads)
    outs, grad = _run(cvspconv, net, features, indices, dtype)
    for o, r in zip(outs, ref_outs):
        (oi, of), (ri, rf) = _by_site(o), _by_site(r)
        if oi is not None:
            assert torch.equal(oi, ri.to(oi.dtype))  # output sites equal as sets
        _close(of, rf, tol, "output")
    _close(grad, ref_grad, tol, "input gradient")
    ref_params = dict(ref.named_parameters())
    for k, p in net.named_parameters():
        _close(p.grad, ref_params[k].grad, tol, k)


def _close(a, b, tol, what):
    # tol relative to the tensor's scale: weight gradients sum thousands of products
    scale = max(1.0, float(b.abs().max()))
    torch.testing.assert_close(a, b, atol=tol * scale, rtol=tol, msg=lambda m: f"{what}: {m}")
