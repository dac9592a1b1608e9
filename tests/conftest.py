import os

import torch

# Triton kernels run on the GPU when there is one, else under the interpreter on CPU tensors.
# Set before any cvops triton module is imported (triton reads it when kernels are defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from cvops._core.dispatch import triton_available  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

requires_triton = pytest.mark.skipif(not triton_available(), reason="triton not installed")
