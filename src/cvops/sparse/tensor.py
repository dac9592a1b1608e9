"""``SparseConvTensor``: active-site features, their coordinates, and the kernel maps built on them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .._core.validate import FLOAT_DTYPES, INDEX_DTYPES, check_int, check_tensor, require

OP = "SparseConvTensor"


@dataclass
class IndiceData:
    """A kernel map cached under an ``indice_key``.

    ``indices``/``spatial_shape`` describe the layer's input, ``out_indices``/``out_spatial_shape`` its
    output; ``indice_pairs [K, 2, L]`` and ``indice_num [K]`` are :func:`cvops.get_indice_pairs`'s.
    A ``SparseInverseConv`` with the same key runs this map backwards, from output to input.
    """

    out_indices: torch.Tensor
    indices: torch.Tensor
    indice_pairs: torch.Tensor
    indice_num: torch.Tensor
    spatial_shape: list[int]
    out_spatial_shape: list[int]
    kernel_size: tuple[int, ...]
    subm: bool
    pairs_by_output: torch.Tensor | None = None  # sort_pairs_by_output(indice_pairs), built on first use

    def pairs_sorted_by_output(self) -> torch.Tensor:
        if self.pairs_by_output is None:
            from .functional import sort_pairs_by_output
            self.pairs_by_output = sort_pairs_by_output(self.indice_pairs, self.indice_num)
        return self.pairs_by_output


class SparseConvTensor:
    """Sparse tensor: ``features [N, C]`` at ``indices [N, ndim + 1]`` rows ``(b, z, y, x)`` (int32).

    ``spatial_shape`` is the grid size ``[D, H, W]`` (or ``[H, W]``), ``batch_size`` the number of
    samples. ``indice_dict`` maps an ``indice_key`` to the :class:`IndiceData` a layer built, so later
    layers with the same key (subm blocks, the inverse conv) reuse it; it is shared by every tensor
    derived from this one, as in spconv/mmcv.
    """

    def __init__(self, features: torch.Tensor, indices: torch.Tensor, spatial_shape, batch_size: int,
                 grid=None):
        check_tensor(OP, "features", features, dim=2, dtypes=FLOAT_DTYPES)
        check_tensor(OP, "indices", indices, dim=2, dtypes=INDEX_DTYPES)
        spatial_shape = [check_int(OP, "spatial_shape", s, min_value=1) for s in
                         (spatial_shape.tolist() if isinstance(spatial_shape, torch.Tensor) else spatial_shape)]
        require(indices.shape[1] == len(spatial_shape) + 1, OP,
                f"indices must be [N, {len(spatial_shape) + 1}] for a {len(spatial_shape)}-D spatial_shape, "
                f"got {tuple(indices.shape)}")
        require(indices.shape[0] == features.shape[0], OP,
                f"indices rows ({indices.shape[0]}) must equal features rows ({features.shape[0]})")
        self.features = features
        self.indices = indices
        self.spatial_shape = spatial_shape
        self.batch_size = check_int(OP, "batch_size", batch_size, min_value=1)
        self.indice_dict: dict = {}
        self.grid = grid  # accepted for mmcv compatibility; cvops builds no dense grid

    @property
    def spatial_size(self) -> int:
        size = 1
        for s in self.spatial_shape:
            size *= s
        return size

    @property
    def ndim(self) -> int:
        return len(self.spatial_shape)

    def find_indice_pair(self, key):
        return None if key is None else self.indice_dict.get(key)

    def replace_feature(self, features: torch.Tensor) -> "SparseConvTensor":
        """A tensor on the same sites (and sharing the kernel-map cache) with new features."""
        out = SparseConvTensor(features, self.indices, self.spatial_shape, self.batch_size, self.grid)
        out.indice_dict = self.indice_dict
        return out

    def dense(self, channels_first: bool = True) -> torch.Tensor:
        """The dense tensor ``[B, C, *spatial]`` (or ``[B, *spatial, C]``); inactive sites are 0.

        Differentiable with respect to ``features``. Duplicate coordinates are summed.
        """
        require(self.features.shape[0] == self.indices.shape[0], OP,
                f"dense: features rows ({self.features.shape[0]}) must equal indices rows ({self.indices.shape[0]})")
        if self.indices.shape[0] and not torch.compiler.is_compiling():
            lo, hi = self.indices.amin(0).tolist(), self.indices.amax(0).tolist()
            limits = [self.batch_size] + list(self.spatial_shape)
            for d, (a, b, n) in enumerate(zip(lo, hi, limits)):
                what = "batch index" if d == 0 else f"coordinate {d - 1}"
                require(a >= 0 and b < n, OP, f"dense: indices {what} must lie in [0, {n}), got values in [{a}, {b}]")
        c = self.features.shape[1]
        out = self.features.new_zeros(self.batch_size, *self.spatial_shape, c)
        coords = tuple(col.long() for col in self.indices.t())
        out = out.index_put(coords, self.features, accumulate=True)
        if channels_first:
            out = out.permute(0, self.ndim + 1, *range(1, self.ndim + 1)).contiguous()
        return out

    def __repr__(self) -> str:
        return (f"SparseConvTensor(features={tuple(self.features.shape)}, spatial_shape={self.spatial_shape}, "
                f"batch_size={self.batch_size})")
