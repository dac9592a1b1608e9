"""get_indice_pairs: the sparse-convolution descriptor, ``mluOpGetIndicePairsWorkspaceSize``
and ``mluOpGetIndicePairs`` (int32 descriptors, caller-allocated kernel map)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .._core.errors import Status
from .._core.validate import check_int, require
from ..ops.get_indice_pairs import get_indice_pairs as _functional
from .descriptor import (DataType, TensorDescriptor, check_descriptor, check_descriptors, check_workspace, data_of,
                         entry_point, require_each)

__all__ = ["SparseConvolutionDescriptor", "create_sparse_convolution_descriptor", "get_indice_pairs",
           "get_indice_pairs_workspace_size", "get_sparse_convolution_num_act_out",
           "set_sparse_convolution_descriptor"]

_GIP = "mluOpGetIndicePairs"
_MAX_KERNEL_VOLUME = 4096      # mmcv / MLU-OPS KernelMaxVolume
_MAX_INPUT_SITES = 1_000_000   # MLU-OPS INDICE_IN_LARGE_TENSOR_NUM


@dataclass
class SparseConvolutionDescriptor:
    """``mluOpSparseConvolutionDescriptor_t``: geometry of a 3-D sparse conv and, after
    :func:`get_indice_pairs`, the number of active output sites (``num_act_out``)."""

    dimNb: int = 0
    batch: int = 0
    pad: tuple = ()
    stride: tuple = ()
    dilation: tuple = ()
    input_space: tuple = ()
    filter_space: tuple = ()
    output_space: tuple = ()
    sub_m: int = 0
    transpose: int = 0
    inverse: int = 0
    num_act_out: int = 0
    _set: bool = field(default=False, repr=False)


def create_sparse_convolution_descriptor() -> SparseConvolutionDescriptor:
    """``mluOpCreateSparseConvolutionDescriptor``."""
    return SparseConvolutionDescriptor()


@entry_point("mluOpSetSparseConvolutionDescriptor", handle=False)
def set_sparse_convolution_descriptor(desc, dimNb, batch, pad, stride, dilation, input_space, filter_space,
                                      output_space, sub_m=0, transpose=0, inverse=0) -> Status:
    """``mluOpSetSparseConvolutionDescriptor``. BAD_PARAM unless dimNb == 5 (3-D), batch > 0,
    transpose == 0, inverse == 0, and per dimension pad >= 0, stride, dilation, input, filter and
    output sizes >= 1."""
    op = "mluOpSetSparseConvolutionDescriptor"
    require(isinstance(desc, SparseConvolutionDescriptor), op, "sparse_conv_desc is null")
    arrays = {"pad": (pad, 0), "stride": (stride, 1), "dilation": (dilation, 1), "input_space": (input_space, 1),
              "filter_space": (filter_space, 1), "output_space": (output_space, 1)}  # name: (value, lowest entry)
    for name, (arr, _) in arrays.items():
        require(arr is not None, op, f"{name} is null")
        require(isinstance(arr, (tuple, list, torch.Size)), op, f"{name} must be a sequence of ints, got {arr!r}")
    dimNb = check_int(op, "dimNb", dimNb)
    require(dimNb == 5, op, f"only 3-D sparse convolution is supported: dimNb must be 5, got {dimNb}")
    batch = check_int(op, "batch", batch)
    require(batch > 0, op, f"batch must be > 0, got {batch}")
    sub_m = check_int(op, "sub_m", sub_m)
    require(check_int(op, "transpose", transpose) == 0, op, f"transpose is not supported, got {transpose}")
    require(check_int(op, "inverse", inverse) == 0, op, f"inverse is not supported, got {inverse}")
    for name, (arr, low) in arrays.items():
        values = tuple(check_int(op, name, v) for v in arr)
        require(len(values) >= dimNb - 2, op, f"{name} must have {dimNb - 2} entries, got {len(values)}")
        for idx, v in enumerate(values[:dimNb - 2]):
            require(v >= low, op, f"{name}[{idx}] must be >= {low}, got {v}")
        arrays[name] = values[:dimNb - 2]
    desc.dimNb, desc.batch, desc.sub_m, desc.transpose, desc.inverse = dimNb, batch, int(sub_m != 0), 0, 0
    for name, values in arrays.items():
        setattr(desc, name, values)
    desc._set = True


def get_sparse_convolution_num_act_out(desc) -> tuple[Status, int]:
    """``mluOpGetSparseConvolutionNumActOut``: ``(status, num_act_out)``; NOT_INITIALIZED for a null desc."""
    if not isinstance(desc, SparseConvolutionDescriptor):
        return Status.NOT_INITIALIZED, 0
    return Status.SUCCESS, desc.num_act_out


def _check(sparse_conv_desc, indices_desc, indice_pairs_desc, out_indices_desc, indice_num_desc) -> bool:
    """The descriptor checks of ``internalGetIndicePairs``, in its order. True: zero elements."""
    op = _GIP
    require(isinstance(sparse_conv_desc, SparseConvolutionDescriptor), op, "sparse_conv_desc is null")
    require(sparse_conv_desc._set, op, "sparse_conv_desc was not set (mluOpSetSparseConvolutionDescriptor)")
    descs = {"indices_desc": indices_desc, "indice_pairs_desc": indice_pairs_desc,
             "out_indices_desc": out_indices_desc, "indice_num_desc": indice_num_desc}
    for name, d in descs.items():
        check_descriptor(op, name, d, size_limit=False)  # the size limit comes later in MLU-OPS's order
    desc = sparse_conv_desc
    require(indices_desc.dim == 2, op, f"indices must be 2-D, got {indices_desc.shape}")
    require(indice_pairs_desc.dim == 3, op, f"indice_pairs must be 3-D, got {indice_pairs_desc.shape}")
    require(out_indices_desc.dim == 2, op, f"out_indices must be 2-D, got {out_indices_desc.shape}")
    require(indice_num_desc.dim == 1, op, f"indice_num must be 1-D, got {indice_num_desc.shape}")
    require(indices_desc.shape[1] == 4, op, f"indices must be [L, 4], got {indices_desc.shape}")
    require(out_indices_desc.shape[1] == 4, op, f"out_indices must be [M, 4], got {out_indices_desc.shape}")
    require(indice_pairs_desc.shape[1] == 2, op, f"indice_pairs must be [K, 2, L], got {indice_pairs_desc.shape}")
    L = indices_desc.shape[0]
    require(indice_pairs_desc.shape[2] == L, op,
            f"indice_pairs dims[2] ({indice_pairs_desc.shape[2]}) must equal indices dims[0] ({L})")
    require(indice_pairs_desc.shape[0] == indice_num_desc.shape[0], op,
            f"indice_pairs dims[0] ({indice_pairs_desc.shape[0]}) must equal indice_num dims[0] "
            f"({indice_num_desc.shape[0]})")
    kernel_volume, out_volume, in_volume = (math.prod(space) for space in
                                            (desc.filter_space, desc.output_space, desc.input_space))
    require(L <= desc.batch * in_volume, op, f"indices dims[0] ({L}) must be <= batch * prod(input_space) "
            f"({desc.batch * in_volume})")
    for d, (p, s, dil) in enumerate(zip(desc.pad, desc.stride, desc.dilation)):
        require(p >= 0 and dil >= 1 and s >= 1, op, f"pad[{d}] >= 0, stride[{d}] >= 1, dilation[{d}] >= 1 violated")
        require(dil == 1 or s == 1, op, f"dilation[{d}] ({dil}) and stride[{d}] ({s}) cannot both be > 1")
    require(indice_pairs_desc.shape[0] == kernel_volume, op,
            f"indice_pairs dims[0] ({indice_pairs_desc.shape[0]}) must equal prod(filter_space) ({kernel_volume})")
    require(kernel_volume <= _MAX_KERNEL_VOLUME, op,
            f"prod(filter_space) ({kernel_volume}) must be <= {_MAX_KERNEL_VOLUME}")
    require(out_indices_desc.shape[0] <= desc.batch * out_volume, op,
            f"out_indices dims[0] ({out_indices_desc.shape[0]}) must be <= batch * prod(output_space) "
            f"({desc.batch * out_volume})")
    require(L <= _MAX_INPUT_SITES, op, f"indices dims[0] ({L}) must be <= {_MAX_INPUT_SITES}")
    check_descriptors(op, descs)  # 2^31 elements or more: NOT_SUPPORTED
    require_each(op, descs, dtypes=(DataType.INT32,))
    if desc.sub_m:
        for d in range(len(desc.input_space)):
            require(desc.input_space[d] == desc.output_space[d], op,
                    f"subm requires input_space[{d}] ({desc.input_space[d]}) == output_space[{d}] "
                    f"({desc.output_space[d]})")
            require(desc.stride[d] == 1, op, f"subm requires stride[{d}] == 1, got {desc.stride[d]}")
            require(desc.dilation[d] == 1, op, f"subm requires dilation[{d}] == 1, got {desc.dilation[d]}")
    return any(d.numel == 0 for d in descs.values())


@entry_point("mluOpGetIndicePairsWorkspaceSize", query=True)
def get_indice_pairs_workspace_size(handle, sparse_conv_desc, indices_desc, indice_pairs_desc, out_indices_desc,
                                    indice_num_desc) -> tuple[Status, int]:
    """``mluOpGetIndicePairsWorkspaceSize``: ``(status, workspace_size)``.

    The size is what the sort-based join here allocates: an int64 key per (offset, input row) slot
    plus the sorted keys and their order (0 for zero-element tensors or on failure).
    """
    # MLU-OPS answers 0 for a zero-element tensor before its other checks (only null descriptors fail)
    require(isinstance(sparse_conv_desc, SparseConvolutionDescriptor), _GIP, "sparse_conv_desc is null")
    descs = (indices_desc, indice_pairs_desc, out_indices_desc, indice_num_desc)
    for name, d in zip(("indices_desc", "indice_pairs_desc", "out_indices_desc", "indice_num_desc"), descs):
        require(isinstance(d, TensorDescriptor), _GIP, f"{name} is null")
    if any(d.numel == 0 for d in descs):
        return 0
    _check(sparse_conv_desc, *descs)
    L, K = indices_desc.shape[0], indice_pairs_desc.shape[0]
    return 8 * K * L + 16 * L


@entry_point(_GIP)
def get_indice_pairs(handle, sparse_conv_desc, indices_desc, indices, workspace, workspace_size,
                     indice_pairs_desc, indice_pairs, out_indices_desc, out_indices, indice_num_desc, indice_num):
    """``mluOpGetIndicePairs``: writes ``indice_pairs [K, 2, L]``, ``out_indices [num_act_out, 4]`` (the
    first rows of ``out_indices``) and ``indice_num [K]`` in place; ``num_act_out`` is stored in
    ``sparse_conv_desc`` (read it with :func:`get_sparse_convolution_num_act_out`).

    Statuses as in MLU-OPS (semantics.md §5): every descriptor rule is BAD_PARAM (2^31 elements:
    NOT_SUPPORTED); any zero-element tensor: SUCCESS with ``num_act_out = 0`` and outputs untouched;
    then null data or a null workspace with ``workspace_size > 0``: BAD_PARAM. Beyond MLU-OPS (which
    would write out of bounds), index values outside ``[0, batch) x [0, input_space)``, duplicate subm
    sites and an ``out_indices`` too short for the active output sites are BAD_PARAM, with nothing written.
    """
    op, desc = _GIP, sparse_conv_desc
    if _check(desc, indices_desc, indice_pairs_desc, out_indices_desc, indice_num_desc):
        desc.num_act_out = 0
        return
    indices, indice_pairs, out_indices, indice_num = data_of(
        op, indices=(indices_desc, indices), indice_pairs=(indice_pairs_desc, indice_pairs),
        out_indices=(out_indices_desc, out_indices), indice_num=(indice_num_desc, indice_num))
    check_workspace(op, workspace, workspace_size)
    out, pairs, num = _functional(indices, desc.batch, list(desc.input_space), list(desc.filter_space),
                                  list(desc.stride), list(desc.pad), list(desc.dilation), 0,
                                  subm=bool(desc.sub_m), out_spatial_shape=list(desc.output_space))
    num_act_out = out.shape[0]
    require(num_act_out <= out_indices.shape[0], op,
            f"out_indices has {out_indices.shape[0]} rows but there are {num_act_out} active output sites")
    out_indices[:num_act_out].copy_(out)
    indice_pairs.copy_(pairs)
    indice_num.copy_(num)
    desc.num_act_out = num_act_out
