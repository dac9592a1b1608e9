"""spconv.pytorch.core: ``SparseConvTensor``, ``IndiceData`` and ``expand_nd``."""
from ..sparse.tensor import IndiceData, SparseConvTensor
from .ops import ConvAlgo


def expand_nd(ndim: int, val) -> list[int]:
    """An int or a sequence of ``ndim`` ints, as a list of ``ndim`` ints (spconv's helper)."""
    if isinstance(val, int):
        return [val] * ndim
    vals = [int(v) for v in val]
    if len(vals) != ndim:
        raise ValueError(f"expected {ndim} values, got {vals}")
    return vals


__all__ = ["ConvAlgo", "IndiceData", "SparseConvTensor", "expand_nd"]
