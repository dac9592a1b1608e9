"""Sparse 3-D detection backbones written from their published architecture descriptions, against the
spconv.pytorch 2.x API only (``lib`` is ``cvops.spconv`` or ``spconv.pytorch``): SECOND's VoxelBackBone8x
(conv_input + 4 stages + conv_out), its residual variant VoxelResBackBone8x, a PartA2-style sparse U-Net
(UNetV2: that encoder plus lateral / merge / inverse-conv up blocks) and mmdet3d's SparseEncoder.

Used by tests/ops/test_spconv_backbones.py and benchmarks/bench_spconv_backbones.py.
"""
from __future__ import annotations

import torch
from torch import nn

GRID_ZYX = (41, 1600, 1408)  # KITTI: 1408 x 1600 x 40 voxels, one extra z layer as the detectors use


def _bn(c):
    return nn.BatchNorm1d(c, eps=1e-3, momentum=0.01)


def block(lib, cin, cout, k, stride=1, padding=0, key=None, kind="subm"):
    """conv (no bias) + BatchNorm1d + ReLU; kind: subm, spconv (strided sparse conv) or inverse."""
    if kind == "subm":
        conv = lib.SubMConv3d(cin, cout, k, bias=False, padding=padding, indice_key=key)
    elif kind == "spconv":
        conv = lib.SparseConv3d(cin, cout, k, stride=stride, padding=padding, bias=False, indice_key=key)
    else:
        conv = lib.SparseInverseConv3d(cin, cout, k, indice_key=key, bias=False)
    return lib.SparseSequential(conv, _bn(cout), nn.ReLU())


def make_basic_block(lib):
    class SparseBasicBlock(lib.SparseModule):
        """Two SubM 3x3x3 convs with BatchNorm, an identity shortcut, ReLU after the sum."""

        def __init__(self, planes, key):
            super().__init__()
            self.conv1 = lib.SubMConv3d(planes, planes, 3, padding=1, bias=True, indice_key=key)
            self.bn1, self.relu = _bn(planes), nn.ReLU()
            self.conv2 = lib.SubMConv3d(planes, planes, 3, padding=1, bias=True, indice_key=key)
            self.bn2 = _bn(planes)

        def forward(self, x):
            out = self.conv1(x)
            out = out.replace_feature(self.relu(self.bn1(out.features)))
            out = self.conv2(out)
            out = out.replace_feature(self.bn2(out.features) + x.features)
            return out.replace_feature(self.relu(out.features))

    return SparseBasicBlock


class VoxelBackBone8x(nn.Module):
    def __init__(self, lib, cin=4):
        super().__init__()
        self.conv_input = lib.SparseSequential(lib.SubMConv3d(cin, 16, 3, padding=1, bias=False, indice_key="subm1"),
                                               _bn(16), nn.ReLU())
        self.conv1 = lib.SparseSequential(block(lib, 16, 16, 3, padding=1, key="subm1"))
        self.conv2 = lib.SparseSequential(block(lib, 16, 32, 3, 2, 1, "spconv2", "spconv"),
                                          block(lib, 32, 32, 3, padding=1, key="subm2"),
                                          block(lib, 32, 32, 3, padding=1, key="subm2"))
        self.conv3 = lib.SparseSequential(block(lib, 32, 64, 3, 2, 1, "spconv3", "spconv"),
                                          block(lib, 64, 64, 3, padding=1, key="subm3"),
                                          block(lib, 64, 64, 3, padding=1, key="subm3"))
        self.conv4 = lib.SparseSequential(block(lib, 64, 64, 3, 2, (0, 1, 1), "spconv4", "spconv"),
                                          block(lib, 64, 64, 3, padding=1, key="subm4"),
                                          block(lib, 64, 64, 3, padding=1, key="subm4"))
        self.conv_out = lib.SparseSequential(
            lib.SparseConv3d(64, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
            _bn(128), nn.ReLU())

    def encode(self, x):
        x = self.conv_input(x)
        x1 = self.conv1(x)
        x2 = self.conv2(x1)
        x3 = self.conv3(x2)
        x4 = self.conv4(x3)
        return x1, x2, x3, x4

    def forward(self, x):
        return self.conv_out(self.encode(x)[-1])


class VoxelResBackBone8x(nn.Module):
    def __init__(self, lib, cin=4):
        super().__init__()
        basic = make_basic_block(lib)
        self.conv_input = lib.SparseSequential(lib.SubMConv3d(cin, 16, 3, padding=1, bias=False, indice_key="subm1"),
                                               _bn(16), nn.ReLU())
        self.conv1 = lib.SparseSequential(basic(16, "res1"), basic(16, "res1"))
        self.conv2 = lib.SparseSequential(block(lib, 16, 32, 3, 2, 1, "spconv2", "spconv"), basic(32, "res2"),
                                          basic(32, "res2"))
        self.conv3 = lib.SparseSequential(block(lib, 32, 64, 3, 2, 1, "spconv3", "spconv"), basic(64, "res3"),
                                          basic(64, "res3"))
        self.conv4 = lib.SparseSequential(block(lib, 64, 128, 3, 2, (0, 1, 1), "spconv4", "spconv"),
                                          basic(128, "res4"), basic(128, "res4"))
        self.conv_out = lib.SparseSequential(
            lib.SparseConv3d(128, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
            _bn(128), nn.ReLU())

    def forward(self, x):
        for stage in (self.conv_input, self.conv1, self.conv2, self.conv3, self.conv4, self.conv_out):
            x = stage(x)
        return x


class UNetV2(VoxelBackBone8x):
    """PartA2's sparse U-Net: the VoxelBackBone8x encoder, then per level a lateral SparseBasicBlock, a merge
    SubM block on the concatenated features (plus a channel-reduced shortcut) and an inverse conv up."""

    def __init__(self, lib, cin=4):
        super().__init__(lib, cin)
        basic = make_basic_block(lib)
        self.conv_up_t4, self.conv_up_m4 = basic(64, "subm4"), block(lib, 128, 64, 3, padding=1, key="subm4")
        self.inv_conv4 = block(lib, 64, 64, 3, key="spconv4", kind="inverse")
        self.conv_up_t3, self.conv_up_m3 = basic(64, "subm3"), block(lib, 128, 64, 3, padding=1, key="subm3")
        self.inv_conv3 = block(lib, 64, 32, 3, key="spconv3", kind="inverse")
        self.conv_up_t2, self.conv_up_m2 = basic(32, "subm2"), block(lib, 64, 32, 3, padding=1, key="subm2")
        self.inv_conv2 = block(lib, 32, 16, 3, key="spconv2", kind="inverse")
        self.conv_up_t1, self.conv_up_m1 = basic(16, "subm1"), block(lib, 32, 16, 3, padding=1, key="subm1")
        self.conv5 = block(lib, 16, 16, 3, padding=1, key="subm1")

    @staticmethod
    def _up(x_lateral, x_bottom, conv_t, conv_m, conv_inv):
        x_trans = conv_t(x_lateral)
        merged = x_trans.replace_feature(torch.cat((x_bottom.features, x_trans.features), dim=1))
        x_m = conv_m(merged)
        n, c = merged.features.shape
        reduced = merged.features.view(n, x_m.features.shape[1], -1).sum(dim=2)  # channel reduction
        return conv_inv(x_m.replace_feature(x_m.features + reduced))

    def forward(self, x):
        x1, x2, x3, x4 = self.encode(x)
        out = self.conv_out(x4)
        up4 = self._up(x4, x4, self.conv_up_t4, self.conv_up_m4, self.inv_conv4)
        up3 = self._up(x3, up4, self.conv_up_t3, self.conv_up_m3, self.inv_conv3)
        up2 = self._up(x2, up3, self.conv_up_t2, self.conv_up_m2, self.inv_conv2)
        up1 = self._up(x1, up2, self.conv_up_t1, self.conv_up_m1, self.conv5)
        return out, up1


class SparseEncoder(nn.Module):
    """mmdet3d's SparseEncoder (conv_module blocks): SubM input conv, four encoder stages whose first conv
    (after stage 1) is a strided SparseConv3d, and a (3, 1, 1) / (2, 1, 1) output conv."""

    CHANNELS = ((16,), (32, 32, 32), (64, 64, 64), (64, 64, 64))
    PADDINGS = ((1,), (1, 1, 1), (1, 1, 1), ((0, 1, 1), 1, 1))

    def __init__(self, lib, cin=4):
        super().__init__()
        self.conv_input = lib.SparseSequential(lib.SubMConv3d(cin, 16, 3, padding=1, bias=False, indice_key="subm1"),
                                               _bn(16), nn.ReLU())
        stages, c = [], 16
        for i, (channels, paddings) in enumerate(zip(self.CHANNELS, self.PADDINGS)):
            layers = []
            for j, (out, pad) in enumerate(zip(channels, paddings)):
                if i and not j:
                    layers.append(block(lib, c, out, 3, 2, pad, f"spconv{i + 1}", "spconv"))
                else:
                    layers.append(block(lib, c, out, 3, padding=pad, key=f"subm{i + 1}"))
                c = out
            stages.append(lib.SparseSequential(*layers))
        self.encoder_layers = lib.SparseSequential(*stages)
        self.conv_out = lib.SparseSequential(
            lib.SparseConv3d(c, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
            _bn(128), nn.ReLU())

    def forward(self, x):
        out = self.conv_out(self.encoder_layers(self.conv_input(x)))
        dense = out.dense()
        n, c, d, h, w = dense.shape
        return dense.view(n, c * d, h, w)


BACKBONES = {"VoxelBackBone8x": VoxelBackBone8x, "VoxelResBackBone8x": VoxelResBackBone8x, "UNetV2": UNetV2,
             "SparseEncoder": SparseEncoder}


def lidar_input(num: int, batch: int, grid=GRID_ZYX, channels: int = 4, seed: int = 0):
    """``(features [num, channels], indices [num, 4] int32)``: a LiDAR-like voxel set (cvops's synth)."""
    from tests.support.inputs.get_indice_pairs import lidar_voxels
    indices = lidar_voxels(num, batch, grid, seed=seed)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num, channels, generator=g), indices
