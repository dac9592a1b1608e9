"""The peers that tests and benchmarks compare against, imported where installed."""
from __future__ import annotations

import torch


def spconv_pytorch():
    """``spconv.pytorch`` ready for CPU tensors, or None where spconv does not import (absent, or a build whose
    kernels do not load here). spconv 2.3's CPU backward asks torch.cuda for a stream, which fails on a CPU-only
    torch; stream 0 is what its CPU kernels use, so ``ops.get_current_stream`` returns it there."""
    try:
        import spconv.pytorch as spt
        from spconv.pytorch import ops
    except Exception:  # noqa: BLE001 - not installed, or built without this device
        return None
    if not torch.cuda.is_available():
        ops.get_current_stream = lambda: 0
    return spt
