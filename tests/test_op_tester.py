"""The shared op tester can fail: its comparisons reject a one-ulp change of a pure-IO result, a NaN out of place
and an error over the tolerance, and its input transforms keep the values while changing the strides."""
import pytest
import torch

from tests.support.op_tester import OpTester, plant_specials, strided, transposed


class _Exact(OpTester):
    exact = True


class _Accumulating(OpTester):
    exact = False


def test_exact_comparison_rejects_one_ulp_and_another_nan_payload():
    e = torch.randn(3, 4)
    _Exact().assert_matches(e.clone(), e, "cpu")
    a = e.clone()
    a.view(torch.int32)[1, 2] += 1
    with pytest.raises(AssertionError):
        _Exact().assert_matches(a, e, "cpu")
    e, a = plant_specials(e), plant_specials(e)
    a.view(torch.int32)[a.isnan()] += 1  # another payload
    with pytest.raises(AssertionError):
        _Exact().assert_matches(a, e, "cpu")


def test_accumulating_comparison_tolerance_and_special_values():
    e = torch.randn(100, dtype=torch.float64).float()
    _Accumulating().assert_matches(e * (1 + 1e-4), e, "cpu")
    with pytest.raises(AssertionError):
        _Accumulating().assert_matches(e * (1 + 1e-2), e, "cpu")
    moved = e.clone()
    moved[3] = float("nan")
    with pytest.raises(AssertionError):
        _Accumulating().assert_matches(moved, e, "cpu")
    with pytest.raises(AssertionError):  # an integer result of an accumulating op is still exact
        _Accumulating().assert_matches(torch.arange(4) + (torch.arange(4) == 2), torch.arange(4), "cpu")


@pytest.mark.parametrize("view", [strided, transposed])
def test_views_keep_values_and_change_strides(view):
    t = torch.randn(2, 3, 4, 5)
    v = view(t)
    assert torch.equal(v, t) and not v.is_contiguous()


def test_specials_are_planted():
    t = plant_specials(torch.randn(50))
    assert t.isnan().sum() == 2 and t.isinf().sum() == 2 and (t.view(torch.int32) == 0x7FC00123).sum() == 1
