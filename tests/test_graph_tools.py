"""Every cvops.nn module (and its cvops.mmcv twin) under torch.jit.script, torch.fx.symbolic_trace,
torch.export.export and torch.compile(fullgraph=True): same output as eager, gradients where the tool
keeps autograd, and the scripted module survives save/load. Small shapes: each tool compiles once."""
import io

import pytest
import torch

import cvops
import cvops.mmcv


def _cases():
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(1, 5, 6, generator=g) > 0.5).float()
    mask[0, 0, 0] = 1.0  # at least one point
    return {
        "PSAMask-collect": (lambda ns: ns.PSAMask("collect", (3, 3)), (torch.randn(2, 9, 4, 5, generator=g),)),
        "PSAMask-distribute": (lambda ns: ns.PSAMask("distribute", 3), (torch.randn(1, 9, 3, 3, generator=g),)),
        "CARAFE": (lambda ns: ns.CARAFE(3, 2, 2), (torch.randn(1, 4, 3, 4, generator=g),
                                                   torch.rand(1, 18, 6, 8, generator=g))),
        "CARAFENaive": (lambda ns: ns.CARAFENaive(1, 1, 3), (torch.randn(2, 2, 2, 3, generator=g),
                                                             torch.rand(2, 1, 6, 9, generator=g))),
        "CARAFEPack": (lambda ns: ns.CARAFEPack(4, 2, up_kernel=3, compressed_channels=4),
                       (torch.randn(1, 4, 3, 3, generator=g),)),
        "MaskedConv2d": (lambda ns: ns.MaskedConv2d(2, 3, 3, padding=1), (torch.randn(1, 2, 5, 6, generator=g), mask)),
        "MaskedConv2d-nobias": (lambda ns: ns.MaskedConv2d(2, 3, (3, 1), padding=(0, 1), bias=False),
                                (torch.randn(1, 2, 5, 6, generator=g), mask[:, :, :])),
        "MaskedConv2d-nomask": (lambda ns: ns.MaskedConv2d(2, 3, 3), (torch.randn(2, 2, 5, 6, generator=g),)),
    }


CASES = _cases()
NAMESPACES = {"nn": cvops.nn, "mmcv": cvops.mmcv}


def _module(name, ns="nn"):
    torch.manual_seed(1)
    build, args = CASES[name]
    return build(NAMESPACES[ns]).eval(), args


def _same(actual, expected):
    # the masked conv's eager route may be the dense conv, the scripted one a gather and addmm: equal to rounding
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ns", sorted(NAMESPACES))
@pytest.mark.parametrize("name", sorted(CASES))
def test_script_matches_eager_and_saves(name, ns):
    module, args = _module(name, ns)
    scripted = torch.jit.script(module)
    expected = module(*args)
    _same(scripted(*args), expected)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    _same(torch.jit.load(buffer)(*args), expected)


@pytest.mark.parametrize("name", sorted(CASES))
def test_fx_symbolic_trace(name):
    module, args = _module(name)
    # fx cannot branch on a Proxy: an optional input left out is given as a concrete None (fx's rule)
    traced = torch.fx.symbolic_trace(module, concrete_args={"mask": None} if name.endswith("nomask") else None)
    targets = {getattr(n.target, "__name__", str(n.target)) for n in traced.graph.nodes if n.op == "call_function"}
    if not name.endswith("nomask"):  # the cvops call is one node (the checks need real tensors)
        assert any(t.startswith("_call_") for t in targets), targets
    _same(traced(*args), module(*args))


@pytest.mark.parametrize("name", sorted(CASES))
def test_export(name):
    module, args = _module(name)
    exported = torch.export.export(module, args)
    ops = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    if not name.endswith("nomask"):
        assert any(op.startswith("cvops.") for op in ops), ops  # the custom op stays in the graph
    _same(exported.module()(*args), module(*args))


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_fullgraph(name):
    module, args = _module(name)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    args = tuple(a.clone().requires_grad_(a.is_floating_point() and i == 0) for i, a in enumerate(args))
    out = compiled(*args)
    _same(out, module(*args))
    out.square().sum().backward()  # the registered autograd formulas run inside the compiled graph
    assert args[0].grad is not None and torch.isfinite(args[0].grad).all()


def test_scripted_checks_raise():
    scripted = torch.jit.script(cvops.nn.PSAMask("collect", (3, 3)))
    with pytest.raises(torch.jit.Error, match="h_mask \\* w_mask"):
        scripted(torch.randn(1, 8, 4, 4))
    carafe = torch.jit.script(cvops.nn.CARAFE(3, 1, 2))
    with pytest.raises(torch.jit.Error, match="masks must be"):
        carafe(torch.randn(1, 2, 3, 3), torch.rand(1, 9, 5, 6))
    conv = torch.jit.script(cvops.nn.MaskedConv2d(2, 3, 3, stride=2))
    with pytest.raises(torch.jit.Error, match="stride, dilation and groups"):
        conv(torch.randn(1, 2, 5, 5), torch.ones(1, 5, 5))


def test_scripted_module_trains():
    module, (x,) = _module("CARAFEPack")
    scripted = torch.jit.script(module.train())
    x = x.clone().requires_grad_()
    scripted(x).sum().backward()
    assert x.grad is not None and module.content_encoder.weight.grad is not None
    eager_x = x.detach().clone().requires_grad_()
    module(eager_x).sum().backward()
    torch.testing.assert_close(x.grad, eager_x.grad)


def test_nn_exports_only_its_modules():
    public = {name for name in vars(cvops.nn) if not name.startswith("_")}
    assert public == set(cvops.nn.__all__)
    assert all(issubclass(getattr(cvops.nn, name), torch.nn.Module) for name in public)
