"""Weight layouts of sparse convolutions and conversion between them.

``cvops.sparse`` and ``cvops.spconv`` store spconv 2.x's ``weight [C_out, *kernel_size, C_in]``
("KRSC"), so spconv 2.x checkpoints load with a plain ``load_state_dict``; ``cvops.mmcv`` stores mmcv's
``[*kernel_size, C_in, C_out]`` ("RSCK"). Kernel offsets are row-major over (kz, ky, kx) in both.
:func:`load_state_dict` loads a checkpoint of any layout below into either (``layout="mmcv"`` for mmcv
and spconv 1.x checkpoints).

Layouts in use:

=========== ============================== =====================================================
name        shape                          who
=========== ============================== =====================================================
``"mmcv"``  ``[*k, C_in, C_out]`` (RSCK)   mmcv ``SparseConvolution``; spconv 1.x; spconv 2.x
                                           ``ConvAlgo.Native`` with ``FILTER_HWIO``
``"spconv"`` ``[C_out, *k, C_in]`` (KRSC)  spconv 2.x default (implicit-GEMM algorithms)
``"RSKC"``  ``[*k, C_out, C_in]``          spconv 2.x ``ConvAlgo.Native`` without ``FILTER_HWIO``
``"torch"`` ``[C_out, C_in, *k]``          ``torch.nn.Conv3d`` / ``Conv2d`` (dense cross-correlation)
=========== ============================== =====================================================
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


def _to_mmcv(w: torch.Tensor, layout: str) -> torch.Tensor:
    n = w.dim() - 2  # spatial dimensions
    if layout == "mmcv":
        return w
    if layout == "spconv":  # [O, *k, I] -> [*k, I, O]
        return w.permute(*range(1, n + 1), n + 1, 0)
    if layout == "RSKC":  # [*k, O, I] -> [*k, I, O]
        return w.transpose(-1, -2)
    return w.permute(*range(2, n + 2), 1, 0)  # torch [O, I, *k] -> [*k, I, O]


def _from_mmcv(w: torch.Tensor, layout: str) -> torch.Tensor:
    n = w.dim() - 2
    if layout == "mmcv":
        return w
    if layout == "spconv":  # [*k, I, O] -> [O, *k, I]
        return w.permute(n + 1, *range(n), n)
    if layout == "RSKC":
        return w.transpose(-1, -2)
    return w.permute(n + 1, n, *range(n))  # -> [O, I, *k]


def convert_weight(weight: torch.Tensor, src: str, dst: str = "mmcv") -> torch.Tensor:
    """Reorder a sparse-conv weight from layout ``src`` to layout ``dst`` (a contiguous copy).

    ``convert_weight(spconv_layer.weight, "spconv")`` gives the cvops/mmcv ``[*k, C_in, C_out]``.
    """
    require(isinstance(weight, torch.Tensor) and weight.dim() >= 3, OP,
            f"weight must be a tensor with kernel dims and two channel dims, got {getattr(weight, 'shape', weight)}")
    return _from_mmcv(_to_mmcv(weight, _layout(src)), _layout(dst)).contiguous()


def load_state_dict(model: nn.Module, state_dict: dict, layout: str = "mmcv", strict: bool = True):
    """Load a checkpoint whose sparse-conv weights are in ``layout`` into a cvops model.

    Each cvops sparse convolution's ``<prefix>weight`` is converted from ``layout`` to the layer's own
    layout (its ``WEIGHT_LAYOUT``), after checking its shape against the layer's ``in_channels``,
    ``out_channels`` and ``kernel_size``; all other entries load unchanged. A checkpoint already in the
    model's layout needs no call: ``model.load_state_dict`` loads it.
    """
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
        expected = tuple(_from_mmcv(_to_mmcv(module.weight.detach(), dst), src).shape)
        require(tuple(w.shape) == expected, OP,
                f"{key}: shape {tuple(w.shape)} is not the {src!r} layout {expected} of {module.extra_repr()}")
        converted[key] = convert_weight(w, src, dst)
    return model.load_state_dict(converted, strict=strict)
