"""torchvision's compiled ops, where they load beside this torch build.

``DeformConv2d`` and ``batched_nms`` take torchvision's kernels when ``torchvision.ops`` works here and plain
torch otherwise: PyPI's torchvision is a CUDA build, whose compiled ops do not load beside a CPU-only torch.
"""
from __future__ import annotations

import functools
import types
from typing import Optional


@functools.lru_cache(maxsize=None)
def torchvision_ops() -> Optional[types.ModuleType]:
    """``torchvision.ops`` if its ``nms`` and ``deform_conv2d`` kernels are registered with torch, else None."""
    try:
        import torch
        import torchvision.ops
        torch.ops.torchvision.nms  # noqa: B018  (raises where the compiled ops did not load)
        torch.ops.torchvision.deform_conv2d  # noqa: B018
    except Exception:  # a mismatched build fails in many ways (ImportError, OSError, RuntimeError, AttributeError)
        return None
    return torchvision.ops
