"""Weight layouts of sparse convolutions and conversion between them (docs/SPARSE.md): ``"spconv"``
``[C_out, *k, C_in]`` (KRSC: ``cvops.sparse``, ``cvops.spconv``), ``"mmcv"`` ``[*k, C_in, C_out]`` (RSCK: mmcv,
spconv 1.x, spconv 2.x Native with ``FILTER_HWIO``; ``cvops.mmcv``), ``"RSKC"`` ``[*k, C_out, C_in]`` (spconv 2.x
Native without it) and ``"torch"`` ``[C_out, C_in, *k]``; kernel offsets are row-major over (kz, ky, kx) in all.
"""
from __future__ import annotations

import torch
from torch import nn

from .._core.validate import require

OP = "sparse.weights"
LAYOUTS = ("mmcv", "spconv", "RSKC", "torch")
_ALIASES = {"rsck": "mmcv", "hwio": "mmcv", "spconv1": "mmcv", "spconv2": "spconv", "krsc": "spconv",
            "rskc": "RSKC", "oidhw": "torch", "oihw": "torch"}


def _layout(name: str) -> str:
    require(isinstance(name, str), OP, f"layout must be a string, got {name!r}")
    key = _ALIASES.get(name.lower(), name if name in LAYOUTS else name.lower() if name.lower() in LAYOUTS else None)
    require(key in LAYOUTS, OP, f"layout must be one of {LAYOUTS} (or an alias {sorted(_ALIASES)}), got {name!r}")
    return key


def _axes(layout: str, n: int) -> list[str]:
    """The axes of a weight with ``n`` kernel dims in ``layout``: ``O``, ``I`` and ``k0 .. k{n-1}``."""
    k = [f"k{d}" for d in range(n)]
    return {"mmcv": [*k, "I", "O"], "spconv": ["O", *k, "I"], "RSKC": [*k, "O", "I"], "torch": ["O", "I", *k]}[layout]


def _permuted(w: torch.Tensor, src: str, dst: str) -> torch.Tensor:
    """``w`` (in layout ``src``) viewed in layout ``dst``."""
    src_axes, dst_axes = _axes(src, w.dim() - 2), _axes(dst, w.dim() - 2)
    return w.permute(*(src_axes.index(a) for a in dst_axes))


def convert_weight(weight: torch.Tensor, src: str, dst: str = "mmcv") -> torch.Tensor:
    """Reorder a sparse-conv weight from layout ``src`` to layout ``dst`` (a contiguous copy).

    ``convert_weight(spconv_layer.weight, "spconv")`` gives the cvops/mmcv ``[*k, C_in, C_out]``.
    """
    require(isinstance(weight, torch.Tensor) and weight.dim() >= 3, OP,
            f"weight must be a tensor with kernel dims and two channel dims, got {getattr(weight, 'shape', weight)}")
    return _permuted(weight, _layout(src), _layout(dst)).contiguous()


def load_state_dict(model: nn.Module, state_dict: dict, layout: str = "mmcv", strict: bool = True):
    """Load a checkpoint whose sparse-conv weights are in ``layout`` into a cvops model: each sparse
    convolution's weight is shape-checked and converted to the layer's ``WEIGHT_LAYOUT``; all other
    entries load unchanged."""
    from .modules import SparseConvolution

    src = _layout(layout)
    converted = dict(state_dict)
    for name, module in model.named_modules():
        if not isinstance(module, SparseConvolution):
            continue
        key = f"{name}.weight" if name else "weight"
        if key not in converted:
            continue
        w = converted[key]
        dst = _layout(module.WEIGHT_LAYOUT)
        expected = tuple(_permuted(module.weight.detach(), dst, src).shape)
        require(tuple(w.shape) == expected, OP,
                f"{key}: shape {tuple(w.shape)} is not the {src!r} layout {expected} of {module.extra_repr()}")
        converted[key] = convert_weight(w, src, dst)
    return model.load_state_dict(converted, strict=strict)
