"""Sparse convolution modules: the one implementation behind ``cvops.sparse``, ``cvops.spconv`` and
``cvops.mmcv``'s sparse classes. They follow spconv 2.x and mmcv where the design doc differs (SubM centres
the kernel and ignores ``padding``; ``indice_key`` caches maps copy-on-write; the weight layout is the
class attribute ``WEIGHT_LAYOUT``): docs/SPARSE.md lists the conventions and what differs from the peers.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._core.errors import NotSupportedError
from .._core.validate import check_int, pair, require
from ..ops.get_indice_pairs import get_deconv_output_size, get_indice_pairs
from ..ops.get_indice_pairs.checks import check_index_values
from .functional import _indice_conv
from .kmap import conv_output_size, identity_offset
from .tensor import IndiceData, SparseConvTensor

MAX_NUM_VOXELS = "max_num_voxels_during_training"  # spconv 2.x's buffer name (record_voxel_count)


def get_indice_pairs_nd(indices, batch_size, spatial_shape, kernel_size, stride, padding, dilation, subm,
                        transpose=False, out_padding=0):
    """The layer's kernel map from :func:`cvops.get_indice_pairs` (1-D to 4-D grids)."""
    return get_indice_pairs(indices, batch_size, list(spatial_shape), list(kernel_size), list(stride),
                            list(padding), list(dilation), out_padding, subm=subm, transpose=transpose)


def centred_padding(kernel_size, dilation) -> tuple[int, ...]:
    """The padding that centres a SubM kernel: ``dilation * (k // 2)`` per axis (spconv, mmcv)."""
    return tuple(d * (k // 2) for k, d in zip(kernel_size, dilation))


class SparseModule(nn.Module):
    """Base class of the modules that take and return a :class:`SparseConvTensor` (spconv's ``name``)."""

    def __init__(self, name=None):
        super().__init__()
        self.name = name
        self._sparse_unique_name = ""


class KernelMapLayer(SparseModule):
    """Base of the layers that run a kernel map (convolutions and pools): their checked geometry, spconv's
    ``max_num_voxels_during_training`` buffer and the tensor they return."""

    def _init_geometry(self, ndim, kernel_size, stride, padding, dilation, subm, indice_key, algo) -> None:
        cls = type(self).__name__
        self.ndim = check_int(cls, "ndim", ndim, min_value=1)
        require(ndim <= 4, cls, f"ndim must be 1 to 4, got {ndim}")
        self.kernel_size = pair(cls, "kernel_size", kernel_size, ndim, min_value=1)
        self.stride = pair(cls, "stride", stride, ndim, min_value=1)
        self.padding = pair(cls, "padding", padding, ndim, min_value=0)
        self.dilation = pair(cls, "dilation", dilation, ndim, min_value=1)
        for s, d in zip(self.stride, self.dilation):
            require(s == 1 or d == 1, cls, f"stride {self.stride} and dilation {self.dilation} cannot both be > 1")
        require(not subm or all(s == 1 for s in self.stride), cls, f"subm needs stride 1, got {self.stride}")
        self.subm = bool(subm)
        self.indice_key = indice_key
        self.algo = algo

    inverse = False  # an inverse convolution restores an earlier layer's sites

    def _init_voxel_count(self, record_voxel_count, device=None) -> None:
        """spconv's ``record_voxel_count``: a buffer holding the most output sites seen (on layers that
        make new sites: not SubM, not inverse)."""
        self.record_voxel_count = bool(record_voxel_count)
        if self.record_voxel_count and not self.subm and not self.inverse:
            self.register_buffer(MAX_NUM_VOXELS, torch.zeros(1, dtype=torch.int32, device=device))

    def get_max_num_voxels(self):
        return getattr(self, MAX_NUM_VOXELS, None)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # spconv: a record_voxel_count layer loads a checkpoint saved without the buffer
        key = prefix + MAX_NUM_VOXELS
        if hasattr(self, MAX_NUM_VOXELS) and key not in state_dict:
            state_dict[key] = torch.zeros(1, dtype=torch.int32)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _output(self, x, indice_dict, features, out_indices, out_spatial) -> SparseConvTensor:
        """A shadow copy of the input ``x`` holding the layer's output; the voxel-count buffer updated."""
        buf = self.get_max_num_voxels()
        if buf is not None:
            buf.fill_(max(int(buf.item()), out_indices.shape[0]))
        out = x.shadow_copy()
        out.indice_dict, out.features, out.indices = indice_dict, features, out_indices
        out.spatial_shape = list(out_spatial)
        return out


def check_input(name: str, x, ndim: int) -> None:
    require(isinstance(x, SparseConvTensor), name, f"input must be a SparseConvTensor, got {type(x).__name__}")
    require(x.ndim == ndim, name, f"input is {x.ndim}-D, the layer {ndim}-D")
    require(x.features.shape[0] == x.indices.shape[0], name,
            f"input features rows ({x.features.shape[0]}) must equal its indices rows ({x.indices.shape[0]}) "
            "(were .features reassigned?)")


def same_sites(indices: torch.Tensor, *built_on: torch.Tensor) -> bool:
    """Whether ``indices`` are the sites (rows, in order) a kernel map was built on: the very tensor or an
    equal one."""
    if any(indices is t for t in built_on):
        return True
    ref = built_on[0]
    return indices.shape == ref.shape and torch.equal(indices, ref.to(indices.device, indices.dtype))


def kernel_map(layer, x: SparseConvTensor, *, inverse: bool = False, transposed: bool = False,
               output_padding=None) -> tuple[IndiceData, dict]:
    """The kernel map of ``layer`` on ``x`` and the ``indice_dict`` of the layer's output (a copy of
    ``x.indice_dict`` with a new map added: copy-on-write, as spconv 2.x). The map cached under
    ``layer.indice_key`` is reused only with the same geometry on the very sites, in the same row order, it
    was built on; anything else under that key is a ``BadParamError`` naming it.
    """
    name = type(layer).__name__
    key = layer.indice_key
    data = x.find_indice_pair(key)
    kernel, dilation = tuple(layer.kernel_size), tuple(layer.dilation)
    if inverse:
        require(data is not None, name, f"no kernel map cached under indice_key={key!r}; the sparse conv it "
                "inverts must run first on this tensor's ancestors")
        require(not data.subm, name, f"indice_key={key!r} holds a subm map; inverse needs a sparse conv's")
        require(tuple(data.kernel_size) == kernel, name,
                f"kernel_size {kernel} must equal that of the conv it inverts, {tuple(data.kernel_size)}")
        require(list(data.out_spatial_shape) == list(x.spatial_shape) and same_sites(x.indices, data.out_indices),
                name, f"input ({x.indices.shape[0]} sites, spatial {x.spatial_shape}) must be the output of the conv "
                f"it inverts under indice_key={key!r} ({data.out_indices.shape[0]} sites, spatial "
                f"{data.out_spatial_shape}), on the same sites in the same row order")
        return data, dict(x.indice_dict)
    subm = bool(layer.subm)
    padding = centred_padding(kernel, dilation) if subm else tuple(layer.padding)
    stride = tuple(layer.stride)
    if data is not None:
        require(data.subm == subm, name, f"indice_key={key!r} holds a {'subm' if data.subm else 'sparse conv'} "
                f"map; this {'subm' if subm else 'sparse conv'} layer needs its own key")
        require(tuple(data.kernel_size) == kernel, name,
                f"layers sharing indice_key={key!r} must have the same kernel size: {tuple(data.kernel_size)} "
                f"there, {kernel} here")
        require(tuple(data.dilation) == dilation, name,
                f"layers sharing indice_key={key!r} must have the same dilation: {tuple(data.dilation)} there, "
                f"{dilation} here")
        require(subm or (tuple(data.stride) == stride and tuple(data.padding) == padding
                         and data.transposed == transposed), name,
                f"layers sharing indice_key={key!r} must have the same stride and padding: stride "
                f"{tuple(data.stride)}, padding {tuple(data.padding)} there, stride {stride}, padding {padding} here")
        sites = (data.indices, data.out_indices) if subm else (data.indices,)  # a subm map's sites are both
        require(list(data.spatial_shape) == list(x.spatial_shape) and same_sites(x.indices, *sites), name,
                f"layers sharing indice_key={key!r} must see the same sites in the same row order: "
                f"{data.indices.shape[0]} sites on {data.spatial_shape} there, {x.indices.shape[0]} on "
                f"{x.spatial_shape} here")
        return data, dict(x.indice_dict)
    if subm:
        out_spatial = list(x.spatial_shape)
    elif transposed:
        out_spatial = get_deconv_output_size(x.spatial_shape, kernel, stride, padding, dilation,
                                                   output_padding)
    else:
        out_spatial = conv_output_size(x.spatial_shape, kernel, stride, padding, dilation)
        require(all(s >= 1 for s in out_spatial), name,
                f"output spatial shape {out_spatial} is empty for input {x.spatial_shape}")
    out_indices, pairs, num = get_indice_pairs_nd(x.indices, x.batch_size, x.spatial_shape, kernel, stride,
                                                  padding, dilation, subm, transposed, output_padding or 0)
    width = pairs.shape[2] if subm or not pairs.shape[2] else int(num.max())
    if width < pairs.shape[2]:
        # a strided map has a slot per input site in every offset, and an offset pairs about 1/stride**3 of
        # them: kept compact, the slots no offset fills (86% of the strided maps of the four detection backbones
        # in benchmarks/) are not held to the end of the step
        pairs = pairs[:, :, :width].clone()
    data = IndiceData(out_indices, x.indices, pairs, num, list(x.spatial_shape), list(out_spatial), kernel, subm,
                      stride=stride, padding=padding, dilation=dilation, transposed=transposed,
                      algo=getattr(layer, "algo", None))
    indice_dict = dict(x.indice_dict)
    if key is not None:
        indice_dict[key] = data
    return data, indice_dict


class SparseConvolution(KernelMapLayer):
    """Sparse (``subm=False``), submanifold (``subm=True``), transposed (``transposed=True``) or inverse
    (``inverse=True``: the map cached under ``indice_key`` run backwards) convolution with spconv 2.x's
    constructor. ``weight`` is ``[out, *kernel, in]`` (``WEIGHT_LAYOUT = "spconv"``) or ``[*kernel, in, out]``
    (``"mmcv"``); ``bias [out]`` is added at every output site.
    """

    WEIGHT_LAYOUT = "spconv"

    def __init__(self, ndim: int, in_channels: int, out_channels: int, kernel_size=3, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, subm=False, output_padding=0, transposed=False,
                 inverse=False, indice_key=None, algo=None, fp32_accum=None, record_voxel_count=False,
                 act_type=None, act_alpha=0, act_beta=0, large_kernel_fast_algo=False, name=None, device=None,
                 dtype=None):
        super().__init__(name=name)
        cls = type(self).__name__
        self._init_geometry(ndim, kernel_size, stride, padding, dilation, subm, indice_key, algo)
        self.in_channels = check_int(cls, "in_channels", in_channels, min_value=1)
        self.out_channels = check_int(cls, "out_channels", out_channels, min_value=1)
        self.output_padding = pair(cls, "output_padding", output_padding, ndim, min_value=0)
        if check_int(cls, "groups", groups, min_value=1) != 1:
            raise NotSupportedError(cls, f"groups must be 1 (as in mmcv and spconv), got {groups}")
        if act_type is not None and "none" not in str(act_type).lower():
            raise NotSupportedError(cls, f"act_type {act_type!r}: fused activations (spconv inference-only) are "
                                         "not supported; apply the activation as a separate module")
        require(not (subm and (transposed or inverse)) and not (transposed and inverse), cls,
                "at most one of subm, transposed and inverse may be set")
        require(not (inverse and indice_key is None), cls, "inverse convolution needs the indice_key of the "
                                                           "sparse conv it inverts")
        self.groups = 1
        self.transposed = bool(transposed)
        self.inverse = bool(inverse)
        self.fp32_accum, self.large_kernel_fast_algo = fp32_accum, bool(large_kernel_fast_algo)
        self.act_type, self.act_alpha, self.act_beta = act_type, act_alpha, act_beta
        self.conv1x1 = math.prod(self.kernel_size) == 1 and (subm or math.prod(self.stride) == 1)
        self._init_voxel_count(record_voxel_count, device)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(*self.weight_shape(), **factory))
        self.bias = nn.Parameter(torch.empty(self.out_channels, **factory)) if bias else None
        self.reset_parameters()

    def weight_shape(self) -> tuple[int, ...]:
        if self.WEIGHT_LAYOUT == "mmcv":
            return (*self.kernel_size, self.in_channels, self.out_channels)
        return (self.out_channels, *self.kernel_size, self.in_channels)

    def kernel_weight(self) -> torch.Tensor:
        """The weight as ``[K, in, out]``, the matrices :func:`indice_conv` multiplies (a view when it can)."""
        K = math.prod(self.kernel_size)
        if self.WEIGHT_LAYOUT == "mmcv":
            return self.weight.reshape(K, self.in_channels, self.out_channels)
        return self.weight.reshape(self.out_channels, K, self.in_channels).permute(1, 2, 0)

    def reset_parameters(self) -> None:
        # kaiming_uniform(a=sqrt(5)) with fan_in = in_channels * prod(kernel_size), as spconv and torch.nn.Conv3d
        bound = 1.0 / math.sqrt(self.in_channels * math.prod(self.kernel_size))
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
             f"padding={self.padding}, dilation={self.dilation}")
        for flag in ("subm", "transposed", "inverse"):
            if getattr(self, flag):
                s += f", {flag}=True"
        if any(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.bias is None:
            s += ", bias=False"
        if self.indice_key is not None:
            s += f", indice_key={self.indice_key!r}"
        return s

    def forward(self, x: SparseConvTensor, add_input=None) -> SparseConvTensor:
        name = type(self).__name__
        check_input(name, x, self.ndim)
        require(x.features.shape[1] == self.in_channels, name,
                f"input has {x.features.shape[1]} channels, the layer expects {self.in_channels}")
        if self.conv1x1 and not (self.inverse or self.transposed) and (self.subm or not any(self.padding)):
            # a 1x1 kernel keeps every site in place: one matmul, no kernel map (as spconv), but the sites are
            # checked as a kernel map would check them
            check_index_values(x.indices, x.batch_size, x.spatial_shape, name)
            features = torch.mm(x.features, self.kernel_weight()[0])
            out_indices, out_spatial, indice_dict = x.indices, x.spatial_shape, x.indice_dict
        else:
            data, indice_dict = kernel_map(self, x, inverse=self.inverse, transposed=self.transposed,
                                           output_padding=self.output_padding)
            map_rows = (data.out_indices if self.inverse else data.indices).shape[0]
            require(x.features.shape[0] == map_rows, name, f"input features rows ({x.features.shape[0]}) must "
                    f"equal the kernel map's input sites ({map_rows})")
            if self.inverse:
                out_indices, out_spatial, ident = data.indices, data.spatial_shape, -1
            else:
                out_indices, out_spatial = data.out_indices, data.out_spatial_shape
                ident = identity_offset(self.kernel_size, data.padding, self.dilation) if self.subm else -1
            features = _indice_conv(x.features, self.kernel_weight(), data.indice_pairs, data.indice_num,
                                    out_indices.shape[0], inverse=self.inverse, identity_offset=ident,
                                    indice_pairs_by_output=data.pairs_sorted_by_output(), backend=None,
                                    check_values=False)  # the map comes from get_indice_pairs on these sites
        if self.bias is not None:
            features = features + self.bias
        if add_input is not None:  # spconv's fused residual add
            features = features + add_input.features
        return self._output(x, indice_dict, features, out_indices, out_spatial)


class SparseSequential(SparseModule):
    """spconv's ``SparseSequential``: sparse modules get the tensor, any other module (BatchNorm1d, ReLU, ...)
    its ``features`` (skipped on a tensor with no sites, as spconv does)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        from collections import OrderedDict
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for i, module in enumerate(args):
                self.add_module(str(i), module)
        for key, module in kwargs.items():
            require(key not in self._modules, "SparseSequential", f"module name {key!r} exists")
            self.add_module(key, module)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return SparseSequential(*list(self._modules.values())[idx])
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range")
        return list(self._modules.values())[idx % n]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def add(self, module, name=None) -> None:
        if name is None:
            name = str(len(self._modules))
        require(name not in self._modules, "SparseSequential", f"module name {name!r} exists")
        self.add_module(name, module)

    def forward(self, x):
        for module in self._modules.values():
            if isinstance(module, SparseModule):
                x = module(x)
            elif isinstance(x, SparseConvTensor):
                if x.indices.shape[0] != 0:
                    x = x.replace_feature(module(x.features))
            else:
                x = module(x)
        return x


class SparseIdentity(SparseModule):
    """Returns its input (spconv's ``SparseIdentity``)."""

    def forward(self, x):
        return x


class ToDense(SparseModule):
    """``x.dense()``: the ``[B, C, *spatial]`` dense tensor."""

    def forward(self, x: SparseConvTensor) -> torch.Tensor:
        return x.dense()


class RemoveGrid(SparseModule):
    """Drops the tensor's pre-allocated ``grid`` (spconv; cvops never allocates one)."""

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        x.grid = None
        return x


class SparseBatchNorm(nn.BatchNorm1d):
    """``BatchNorm1d`` on a sparse tensor's features."""

    def forward(self, x):
        return x.replace_feature(super().forward(x.features)) if isinstance(x, SparseConvTensor) else super().forward(x)


class SparseReLU(nn.ReLU):
    """``ReLU`` on a sparse tensor's features."""

    def forward(self, x):
        return x.replace_feature(super().forward(x.features)) if isinstance(x, SparseConvTensor) else super().forward(x)
