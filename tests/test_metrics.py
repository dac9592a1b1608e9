"""cvops.metrics: MLU-OPS's accuracy criteria on values worked out by hand."""
import math

import pytest
import torch

from cvops import metrics


def test_diff1_and_diff2_are_relative_sums():
    b = torch.tensor([1.0, -2.0, 4.0])
    a = torch.tensor([1.0, -1.0, 4.0])  # one error of 1
    assert metrics.diff1(a, b) == pytest.approx(1 / 7)
    assert metrics.diff2(a, b) == pytest.approx(math.sqrt(1 / 21))
    assert metrics.diff1(b, b) == 0 and metrics.diff2(b, b) == 0
    with pytest.raises(ValueError, match="shape mismatch"):
        metrics.diff1(a, b[:2])


def test_diff3_is_the_worst_point_absolute_near_zero():
    b = torch.tensor([1e-8, 2.0, 0.5])
    a = torch.tensor([3e-8, 2.5, 0.5])
    assert metrics.diff3(a, b) == pytest.approx(0.25)  # |b| >= eps: relative 0.5 / 2
    assert metrics.diff3(a[:1], b[:1]) == pytest.approx(2e-8)  # |b| < eps: absolute
    nan, inf = float("nan"), float("inf")
    assert metrics.diff3(torch.tensor([nan, inf]), torch.tensor([nan, inf])) == 0
    assert metrics.diff3(torch.tensor([nan, 1.0]), torch.tensor([1.0, 1.0])) == inf
    assert metrics.diff3(torch.tensor([]), torch.tensor([])) == 0


def test_bit_equal_compares_bits():
    x = torch.tensor([0.0, 1.0, float("nan")])
    assert metrics.bit_equal(x, x.clone())
    assert not metrics.bit_equal(x, torch.tensor([-0.0, 1.0, float("nan")]))  # -0.0 == 0.0, other bits
    assert not metrics.bit_equal(x, x.double())
    assert not metrics.bit_equal(x, x[:2])
