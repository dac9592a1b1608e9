"""spconv.pytorch.core: ``SparseConvTensor``, ``IndiceData`` and ``expand_nd``."""
from .._core.validate import pair
from ..sparse.tensor import IndiceData, SparseConvTensor
from .ops import ConvAlgo


def expand_nd(ndim: int, val) -> list[int]:
    """An int or a sequence of ``ndim`` ints, as a list of ``ndim`` ints (spconv's helper)."""
    return list(pair("expand_nd", "val", val, ndim))


__all__ = ["ConvAlgo", "IndiceData", "SparseConvTensor", "expand_nd"]
