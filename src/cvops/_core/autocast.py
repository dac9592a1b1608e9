"""How every cvops custom op behaves inside ``torch.autocast`` (CPU and CUDA), one policy per op
(:data:`POLICIES`): ``KEEP`` (pure data movement) runs on the tensors as given; ``FLOAT32`` (accumulating
ops) casts float16 / bfloat16 arguments to float32, runs with autocast off, and casts floating results back
(a forward's to the autocast dtype, a backward's gradients each to its tensor's dtype); float64 stays float64.
The casts go through the dispatcher, so autograd records them (``torch.library.register_autocast`` would
cast the inputs only).
"""
from __future__ import annotations

from typing import Optional

import torch

KEEP = "keep"
FLOAT32 = "float32"
_HALF = (torch.float16, torch.bfloat16)
AUTOCAST_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}  # the dispatch keys autocast adds per device

# op name -> (policy, for each floating result: the index of the argument whose dtype it takes, or None for
# the autocast dtype). Results that are not floating (mapping_channel, kernel maps) are never cast.
POLICIES: dict[str, tuple[str, tuple[Optional[int], ...]]] = {
    "psamask_forward": (KEEP, ()),
    "psamask_backward": (KEEP, ()),
    "masked_im2col": (KEEP, ()),
    "masked_im2col_backward": (KEEP, ()),
    "masked_col2im": (KEEP, ()),
    "masked_col2im_backward": (KEEP, ()),
    "get_indice_pairs": (KEEP, ()),
    "carafe_forward": (FLOAT32, (None,)),                      # (features, masks, ...) -> out
    "carafe_backward": (FLOAT32, (1, 2)),                      # (grad_out, features, masks) -> (gx, gmask)
    "psroi_pool_forward": (FLOAT32, (None,)),                  # -> (output, mapping_channel)
    "psroi_pool_backward": (FLOAT32, (0,)),                    # (top_grad, ...) -> bottom_grad
    "sparse_indice_conv": (FLOAT32, (None,)),                  # (features, weight, ...) -> out
    "sparse_indice_conv_backward": (FLOAT32, (1, 2)),          # (grad_out, features, weight) -> (gf, gw)
}

_lib: Optional[torch.library.Library] = None


def _kernel(op, device_type: str, policy: str, result_like: tuple[Optional[int], ...]):
    def kernel(*args):
        if policy == KEEP:
            with torch.autocast(device_type, enabled=False):
                return op(*args)
        cast = [a.to(torch.float32) if isinstance(a, torch.Tensor) and a.dtype in _HALF else a for a in args]
        with torch.autocast(device_type, enabled=False):
            out = op(*cast)
        if any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in args):
            return out
        results = list(out) if isinstance(out, (tuple, list)) else [out]
        floating = [i for i, r in enumerate(results) if r.is_floating_point()]
        for i, like in zip(floating, result_like):
            dtype = torch.get_autocast_dtype(device_type) if like is None else args[like].dtype
            results[i] = results[i].to(dtype)
        return tuple(results) if isinstance(out, (tuple, list)) else results[0]

    return kernel


def register() -> None:
    """Installs the autocast kernel of every op in :data:`POLICIES` for CPU and CUDA, once, under the
    ``Autocast<device>`` dispatch keys."""
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("cvops", "IMPL")
    for name, (policy, result_like) in POLICIES.items():
        op = getattr(torch.ops.cvops, name).default
        for device_type, key in AUTOCAST_KEYS.items():
            _lib.impl(name, _kernel(op, device_type, policy, result_like), key)


def _autocast_device(tensors) -> Optional[str]:
    for t in tensors:
        if isinstance(t, torch.Tensor):
            kind = t.device.type
            return kind if kind in AUTOCAST_KEYS and torch.is_autocast_enabled(kind) else None
    return None


def mixed_to_float32(*tensors):
    """Under autocast, tensors of mixed float16 / bfloat16 / float32 dtypes (a float16 feature map with a
    float32 softmax mask) become float32, so a FLOAT32 op's same-dtype checks pass; its autocast
    kernel casts the results. Anything else is returned as given."""
    if _autocast_device(tensors) is None:
        return tensors
    dtypes = {t.dtype for t in tensors if isinstance(t, torch.Tensor) and t.dtype in _HALF + (torch.float32,)}
    if len(dtypes) < 2:
        return tensors
    return tuple(t.to(torch.float32) if isinstance(t, torch.Tensor) and t.dtype in _HALF else t for t in tensors)


def to_autocast_dtype(*tensors):
    """Under autocast, float16 / bfloat16 / float32 tensors in the autocast dtype, as ``torch.conv2d``
    takes them (for composites of data movement and a matmul: masked_conv2d)."""
    device = _autocast_device(tensors)
    if device is None:
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype in _HALF + (torch.float32,) else t
                 for t in tensors)
