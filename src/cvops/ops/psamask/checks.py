"""psamask parameter checks (psamask.md §1.4 and §3.4, semantics.md §1, decisions.md)."""
from __future__ import annotations

from ..._core.layout import nchw_shape, parse_layout
from ..._core.validate import FLOAT_DTYPES, check_tensor, pair, require

OP = "psamask"
COLLECT, DISTRIBUTE = 0, 1
_PSA_TYPES = {"collect": COLLECT, "distribute": DISTRIBUTE, COLLECT: COLLECT, DISTRIBUTE: DISTRIBUTE}


def psa_type_code(psa_type) -> int:
    """'collect'/0 -> 0, 'distribute'/1 -> 1; anything else is an error (MLU-OPS would do nothing)."""
    key = psa_type.lower() if isinstance(psa_type, str) else psa_type
    require(isinstance(key, (int, str)) and not isinstance(key, bool) and key in _PSA_TYPES, OP,
            f"psa_type must be 'collect'/0 or 'distribute'/1, got {psa_type!r}")
    return _PSA_TYPES[key]


def _check(tensor, name, psa_type, mask_size, layout):
    """Checks shared by both directions; returns (code, h_mask, w_mask, layout, (N, C, H, W))."""
    code = psa_type_code(psa_type)
    h_mask, w_mask = pair(OP, "mask_size", mask_size, min_value=1)
    layout = parse_layout(OP, layout)
    check_tensor(OP, name, tensor, dim=4, dtypes=FLOAT_DTYPES)
    return code, h_mask, w_mask, layout, nchw_shape(tensor.shape, layout)


def check_forward(input, psa_type, mask_size, layout):
    """Validate a forward call; returns (psa_type code, h_mask, w_mask, layout)."""
    code, h_mask, w_mask, layout, (_, c, _, _) = _check(input, "input", psa_type, mask_size, layout)
    require(c == h_mask * w_mask, OP,
            f"input channels ({c}) must equal h_mask * w_mask ({h_mask} * {w_mask} = {h_mask * w_mask})")
    return code, h_mask, w_mask, layout


def check_backward(grad_output, psa_type, mask_size, layout):
    """Validate a backward call; returns (psa_type code, h_mask, w_mask, layout)."""
    code, h_mask, w_mask, layout, (_, c, h, w) = _check(grad_output, "grad_output", psa_type, mask_size, layout)
    require(c == h * w, OP, f"grad_output channels ({c}) must equal h_feature * w_feature ({h} * {w} = {h * w})")
    return code, h_mask, w_mask, layout
