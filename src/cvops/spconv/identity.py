"""spconv.pytorch.identity: ``Identity`` (a plain module returning its input)."""
from torch import nn


class Identity(nn.Module):
    def forward(self, input):
        return input

    def input_spatial_size(self, out_size):
        return out_size
