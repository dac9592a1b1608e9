"""``SparseConvTensor``: active-site features, their coordinates, and the kernel maps built on them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .._core.validate import FLOAT_DTYPES, INDEX_DTYPES, check_int, check_tensor, require
from .kmap import sort_pairs_by_output

OP = "SparseConvTensor"


@dataclass
class IndiceData:
    """A kernel map cached under an ``indice_key``: the layer's input (``indices``, ``spatial_shape``) and
    output sites, :func:`cvops.get_indice_pairs`'s ``indice_pairs [K, 2, L]`` and ``indice_num [K]``, and the
    geometry it was built with (``padding``: the centring padding for SubM). spconv's field names are
    properties."""

    out_indices: torch.Tensor
    indices: torch.Tensor
    indice_pairs: torch.Tensor
    indice_num: torch.Tensor
    spatial_shape: list[int]
    out_spatial_shape: list[int]
    kernel_size: tuple[int, ...]
    subm: bool
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    transposed: bool = False
    algo: object = None
    voxel_num: object = None
    pairs_by_output: torch.Tensor | None = field(default=None, repr=False)  # a subm map's, built on first use

    @property
    def indice_pair_num(self) -> torch.Tensor:
        return self.indice_num

    @property
    def is_subm(self) -> bool:
        return self.subm

    @property
    def ksize(self) -> list[int]:
        return list(self.kernel_size)

    def pairs_sorted_by_output(self) -> torch.Tensor:
        """The map in output-row order. Kept for a subm map, which the following layers of its key reuse; a
        strided map's is made anew for each use (its conv, and an inverse conv near the end of the network):
        kept, a copy of the map would be held through the whole forward for that one later use."""
        if self.pairs_by_output is not None:
            return self.pairs_by_output
        pairs = sort_pairs_by_output(self.indice_pairs, self.indice_num)
        if self.subm:
            self.pairs_by_output = pairs
        return pairs


class _Dense(torch.autograd.Function):
    """Rows put (summed) at their sites of a zero grid, written straight into the channels-first storage (no
    transposing copy). The backward gathers each row's gradient from the grid's: autograd's own backward of
    an in-place put into a view first copies the whole grid's gradient (the step's peak memory, on
    SparseEncoder's 69 MB grid)."""

    @staticmethod
    def forward(features, channels_first: bool, shape, *index):
        out = features.new_zeros(shape)
        (out.movedim(1, -1) if channels_first else out).index_put_(index, features, accumulate=True)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output):  # a separate setup_context: torch.func transforms take the function
        _, ctx.channels_first, _, *index = inputs
        ctx.save_for_backward(*index)

    @staticmethod
    def backward(ctx, grad):
        rows = grad.movedim(1, -1) if ctx.channels_first else grad
        return (rows[ctx.saved_tensors], None, None) + (None,) * len(ctx.saved_tensors)


def _ints(name: str, values) -> list[int]:
    """A shape given as list/tuple/torch.Size/tensor/numpy array of integers, as Python ints."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    require(isinstance(values, (list, tuple, torch.Size)), OP, f"{name} must be a sequence of ints, got {values!r}")
    return [check_int(OP, name, v, min_value=1) for v in values]


class SparseConvTensor:
    """Sparse tensor: ``features [N, C]`` at ``indices [N, ndim + 1]`` rows ``(b, *coords)`` (int32) on a grid
    of ``spatial_shape`` (a sequence, tensor or numpy array) for ``batch_size`` samples.

    ``indice_dict`` maps an ``indice_key`` to the :class:`IndiceData` a layer built; layers give their output
    a copy with their map added, never writing their input's (spconv 2.x). ``features`` may be reassigned
    (mmcv) or replaced with :meth:`replace_feature` (spconv); spconv's other keywords have no effect.
    """

    def __init__(self, features: torch.Tensor, indices: torch.Tensor, spatial_shape, batch_size, grid=None,
                 voxel_num=None, indice_dict=None, benchmark: bool = False, permanent_thrust_allocator: bool = False,
                 enable_timer: bool = False, force_algo=None):
        check_tensor(OP, "features", features, dim=2, dtypes=FLOAT_DTYPES)
        check_tensor(OP, "indices", indices, dim=2, dtypes=INDEX_DTYPES)
        spatial_shape = _ints("spatial_shape", spatial_shape)
        require(indices.shape[1] == len(spatial_shape) + 1, OP,
                f"indices must be [N, {len(spatial_shape) + 1}] for a {len(spatial_shape)}-D spatial_shape, "
                f"got {tuple(indices.shape)}")
        require(indices.shape[0] == features.shape[0], OP,
                f"indices rows ({indices.shape[0]}) must equal features rows ({features.shape[0]})")
        self.features = features
        self.indices = indices
        self.spatial_shape = spatial_shape
        self.batch_size = check_int(OP, "batch_size", batch_size, min_value=1)
        self.indice_dict: dict = {} if indice_dict is None else indice_dict
        self.grid = grid  # accepted for spconv/mmcv compatibility; cvops builds no dense grid
        self.voxel_num = voxel_num
        self.benchmark = benchmark
        self.benchmark_record: dict = {}
        self.force_algo = force_algo

    @classmethod
    def from_dense(cls, x: torch.Tensor) -> "SparseConvTensor":
        """The sparse tensor of a channels-last dense ``x [B, *spatial, C]``: one site per position whose
        channel vector is not all zero (spconv's ``from_dense``)."""
        check_tensor(OP, "x", x, dtypes=FLOAT_DTYPES)
        require(3 <= x.dim() <= 6, OP, f"from_dense: x must be [B, *spatial, C] with 1 to 4 spatial dims, got "
                f"{tuple(x.shape)}")
        active = (x != 0).any(dim=-1)
        indices = active.nonzero().to(torch.int32)
        features = x[active]
        return cls(features, indices, list(x.shape[1:-1]), x.shape[0])

    @property
    def spatial_size(self) -> int:
        return math.prod(self.spatial_shape)

    @property
    def ndim(self) -> int:
        return len(self.spatial_shape)

    @property
    def is_quantized(self) -> bool:
        return False

    def find_indice_pair(self, key):
        return None if key is None else self.indice_dict.get(key)

    def shadow_copy(self) -> "SparseConvTensor":
        """A tensor with the same members (the kernel-map cache shared)."""
        out = SparseConvTensor.__new__(type(self))
        out.__dict__.update(self.__dict__)
        return out

    def replace_feature(self, feature: torch.Tensor) -> "SparseConvTensor":
        """A tensor on the same sites (sharing the kernel-map cache) with new features."""
        check_tensor(OP, "feature", feature, dim=2, dtypes=FLOAT_DTYPES)
        require(feature.shape[0] == self.indices.shape[0], OP,
                f"replace_feature: feature rows ({feature.shape[0]}) must equal indices rows "
                f"({self.indices.shape[0]})")
        out = self.shadow_copy()
        out.features = feature
        return out

    def minus(self) -> "SparseConvTensor":
        return self.replace_feature(-self.features)

    def select_by_index(self, valid_indices: torch.Tensor) -> "SparseConvTensor":
        """The sites ``valid_indices`` (rows), with a fresh kernel-map cache (the sites changed)."""
        out = self.shadow_copy()
        out.indices, out.features, out.indice_dict = self.indices[valid_indices], self.features[valid_indices], {}
        return out

    def _other(self, other):
        require(isinstance(other, (SparseConvTensor, torch.Tensor)), OP,
                f"can add a SparseConvTensor or a tensor, got {type(other).__name__}")
        return other.features if isinstance(other, SparseConvTensor) else other

    def __add__(self, other):
        return self.replace_feature(self.features + self._other(other))

    __radd__ = __add__

    def __iadd__(self, other):
        self.features = self.features + self._other(other)
        return self

    def dense(self, channels_first: bool = True) -> torch.Tensor:
        """The dense tensor ``[B, C, *spatial]`` (or ``[B, *spatial, C]``); inactive sites are 0.

        Differentiable with respect to ``features``. Duplicate coordinates are summed. Every site must lie
        on the grid (``0 <= b < batch_size``, ``0 <= coord < spatial_shape``): ``BadParamError`` otherwise.
        """
        require(self.features.shape[0] == self.indices.shape[0], OP,
                f"dense: features rows ({self.features.shape[0]}) must equal indices rows ({self.indices.shape[0]})")
        if self.indices.shape[0] and not torch.compiler.is_compiling():
            lo, hi = self.indices.amin(0).tolist(), self.indices.amax(0).tolist()
            limits = [self.batch_size] + list(self.spatial_shape)
            for d, (a, b, n) in enumerate(zip(lo, hi, limits)):
                what = "batch index" if d == 0 else f"coordinate {d - 1}"
                require(a >= 0 and b < n, OP, f"dense: indices {what} must lie in [0, {n}), got values in [{a}, {b}]")
        b, c, spatial = self.batch_size, self.features.shape[1], tuple(self.spatial_shape)
        shape = (b, c, *spatial) if channels_first else (b, *spatial, c)
        return _Dense.apply(self.features, channels_first, shape, *(col.long() for col in self.indices.t()))

    def __repr__(self) -> str:
        return (f"SparseConvTensor(features={tuple(self.features.shape)}, spatial_shape={self.spatial_shape}, "
                f"batch_size={self.batch_size})")
