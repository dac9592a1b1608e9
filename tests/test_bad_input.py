"""Bad input at every public entry point: each class of bad argument (wrong type, dtype, rank, shapes,
impossible sizes, non-finite values where they are rejected, bad layout/backend strings, mixed
devices) raises the exact cvops exception naming the argument, on every backend, and the MLU-OPS
layer returns a status instead of raising."""
from __future__ import annotations

import pytest
import torch

import cvops
from cvops._core.errors import BadParamError, NotSupportedError
from tests.conftest import requires_triton, selected

BACKENDS = ["reference", "cpu-torch", pytest.param("cpu-numba", marks=pytest.mark.skipif(
    not __import__("cvops._core.jit", fromlist=["x"]).numba_available(), reason="no numba")),
            pytest.param("triton", marks=requires_triton)]


# ------------------------------------------------------------------------------------------ modules
MODULE_CASES = [
    (lambda: cvops.nn.CARAFEPack(8, 0), "scale_factor must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, -2), "scale_factor must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(0, 2), "channels must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, up_kernel=0), "kernel_size must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, up_kernel=4), "kernel_size must be odd"),
    (lambda: cvops.nn.CARAFEPack(8, 2, up_group=0), "group_size must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, up_group=3), "divisible by up_group"),
    (lambda: cvops.nn.CARAFEPack(8, 2, encoder_kernel=0), "encoder_kernel must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, encoder_kernel=2), "encoder_kernel must be odd"),
    (lambda: cvops.nn.CARAFEPack(8, 2, encoder_dilation=0), "encoder_dilation must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8, 2, compressed_channels=0), "compressed_channels must be >= 1"),
    (lambda: cvops.nn.CARAFEPack(8.0, 2), "channels must be an int"),
    (lambda: cvops.nn.CARAFE(0, 1, 2), "kernel_size must be >= 1"),
    (lambda: cvops.nn.CARAFE(3, 0, 2), "group_size must be >= 1"),
    (lambda: cvops.nn.CARAFE(3, 1, 0), "scale_factor must be >= 1"),
    (lambda: cvops.nn.CARAFE(2, 1, 2), "kernel_size must be odd"),
    (lambda: cvops.nn.CARAFE("3", 1, 2), "kernel_size must be an int"),
    (lambda: cvops.nn.CARAFENaive(3, 1, -1), "scale_factor must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(0, 3, 3), "in_channels must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 0, 3), "out_channels must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 0), "kernel_size must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, (3, -1)), "kernel_size must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 3, stride=0), "stride must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 3, padding=-1), "padding must be >= 0"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 3, dilation=0), "dilation must be >= 1"),
    (lambda: cvops.nn.MaskedConv2d(2, 3, 3, groups=0), "groups must be >= 1"),
    (lambda: cvops.nn.PSAMask("collect", 0), "mask_size must be >= 1"),
    (lambda: cvops.nn.PSAMask("collect", (3, -3)), "mask_size must be >= 1"),
    (lambda: cvops.nn.PSAMask("scatter", 3), "psa_type"),
    (lambda: cvops.nn.PSRoIPool(0, 1.0), "pooled_size must be >= 1"),
    (lambda: cvops.nn.PSRoIPool(2, 0.0), "spatial_scale"),
    (lambda: cvops.nn.PSRoIPool(2, float("nan")), "spatial_scale"),
    (lambda: cvops.nn.PSRoIPool(2, 1.0, output_dim=0), "output_dim must be >= 1"),
]


@pytest.mark.parametrize("index", range(len(MODULE_CASES)))
def test_modules_reject_impossible_sizes_at_construction(index):
    build, fragment = MODULE_CASES[index]
    with pytest.raises(BadParamError, match=fragment):
        build()
