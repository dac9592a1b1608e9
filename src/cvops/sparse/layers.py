"""The named convolution classes (``SparseConv3d``, ``SubMConv2d``, ``SparseConvTranspose3d``,
``SparseInverseConv1d``, ...) with spconv 2.x's constructor signatures, made by :func:`conv_classes` for one
base class: spconv's weight layout (``cvops.sparse``, ``cvops.spconv``) or mmcv's (``cvops.mmcv``).
"""
from __future__ import annotations

KINDS = ("SparseConv", "SubMConv", "SparseConvTranspose", "SparseInverseConv")
_DOCS = {
    "SparseConv": "{n}-D sparse convolution: output sites are every site an active input reaches.",
    "SubMConv": "{n}-D submanifold convolution: output sites = input sites, kernel centred (padding ignored).",
    "SparseConvTranspose": "{n}-D transposed sparse convolution (``o = p*stride - padding + t*dilation``).",
    "SparseInverseConv": "{n}-D inverse of the sparse convolution cached under ``indice_key`` (restores its "
                         "input sites).",
}


def _make(base, kind: str, ndim: int, inverse_key_required: bool):
    if kind == "SparseInverseConv":
        def __init__(self, in_channels, out_channels, kernel_size, indice_key, bias=True, algo=None,
                     fp32_accum=None, large_kernel_fast_algo=False, name=None):
            base.__init__(self, ndim, in_channels, out_channels, kernel_size, bias=bias, inverse=True,
                          indice_key=indice_key, algo=algo, fp32_accum=fp32_accum,
                          large_kernel_fast_algo=large_kernel_fast_algo, name=name)
        if not inverse_key_required:  # mmcv's indice_key defaults to None (the layer then asks for one)
            __init__.__defaults__ = (None, *__init__.__defaults__)
    elif kind == "SubMConv":
        def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                     bias=True, indice_key=None, algo=None, fp32_accum=None, large_kernel_fast_algo=False,
                     name=None):
            base.__init__(self, ndim, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                          bias, subm=True, indice_key=indice_key, algo=algo, fp32_accum=fp32_accum,
                          large_kernel_fast_algo=large_kernel_fast_algo, name=name)
    else:
        transposed = kind == "SparseConvTranspose"

        def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                     bias=True, indice_key=None, algo=None, fp32_accum=None, record_voxel_count=False,
                     large_kernel_fast_algo=False, name=None):
            base.__init__(self, ndim, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                          bias, transposed=transposed, indice_key=indice_key, algo=algo, fp32_accum=fp32_accum,
                          record_voxel_count=record_voxel_count, large_kernel_fast_algo=large_kernel_fast_algo,
                          name=name)
    name = f"{kind}{ndim}d"
    return type(name, (base,), {"__init__": __init__, "__doc__": _DOCS[kind].format(n=ndim),
                                "__module__": base.__module__, "__qualname__": name})


def conv_classes(base, *, inverse_key_required: bool = True, ndims=(1, 2, 3, 4)) -> dict:
    """``{"SparseConv3d": cls, ...}``: every kind for every ``ndim`` in ``ndims``, subclasses of ``base``."""
    return {f"{kind}{n}d": _make(base, kind, n, inverse_key_required) for kind in KINDS for n in ndims}
