"""spconv.pytorch.tables: ``JoinTable`` (concatenate features), ``AddTable`` (add them) and ``ConcatTable``
(apply each module to one input) for tensors on the same sites."""
import torch

from .._core.validate import require
from ..sparse.modules import SparseModule


def _same_sites(name, tensors):
    first = tensors[0]
    for t in tensors:
        require(t.spatial_shape == first.spatial_shape and t.batch_size == first.batch_size
                and t.indices.shape[0] == first.indices.shape[0], name,
                "tensors must be on the same sites (spatial_shape, batch_size, number of indices)")


class JoinTable(SparseModule):
    def forward(self, input):
        _same_sites("JoinTable", input)
        return input[0].replace_feature(torch.cat([t.features for t in input], 1))


class AddTable(SparseModule):
    def forward(self, input):
        _same_sites("AddTable", input)
        return input[0].replace_feature(sum(t.features for t in input))


class ConcatTable(SparseModule):
    def forward(self, input):
        return [module(input) for module in self._modules.values()]

    def add(self, module):
        self._modules[str(len(self._modules))] = module
        return self


__all__ = ["AddTable", "ConcatTable", "JoinTable"]
