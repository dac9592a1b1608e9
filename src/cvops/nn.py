"""``torch.nn`` modules with mmcv/torchvision names and signatures, eager and under ``torch.fx``,
``torch.export``, ``torch.compile(fullgraph=True)`` and ``torch.jit.script`` (load scripted modules after
``import cvops``, which registers the ``cvops::`` operators). A forward has two paths:

- eager, fx, export and compile call the functional API through the ``_call_*`` functions, which
  ``torch.fx.wrap`` keeps single graph nodes (their checks inspect real tensors; a ``Proxy`` has no dtype);
- TorchScript cannot compile those checks, so a scripted forward checks the shape rules the kernels rely
  on (``_script_require``) and calls the ``torch.ops.cvops`` operators directly.

In the mmcv modules (CARAFE, CARAFEPack, MaskedConv2d, PSAMask), an argument error that mmcv meets in an
``assert`` (a forward's, CARAFE's and PSAMask's constructors') is a ``BadParamError`` that is also an
``AssertionError``.
"""
import functools as _functools
from typing import List as _List, Optional as _Optional, Tuple as _Tuple, Union as _Union

import torch as _torch
from torch import Tensor as _Tensor, nn as _nn

from ._core.errors import asserts_like_mmcv as _asserts_like_mmcv
from ._core.validate import check_int as _check_int, pair as _pair, require as _require
from .ops.carafe import carafe as _carafe, checks as _carafe_checks
from .ops.masked_im2col import masked_conv2d as _masked_conv2d
from .ops.psamask import checks as _psamask_checks, psamask as _psamask
from .ops.psroipool import checks as _psroipool_checks, psroi_pool as _psroi_pool

__all__ = ["CARAFE", "CARAFENaive", "CARAFEPack", "MaskedConv2d", "PSAMask", "PSRoIPool"]


def _check_sizes(op: str, **limits) -> None:
    """Constructor arguments: each ``name=(value, min_value)`` is an int or a pair of ints (a tuple
    only where the torch module takes one) of at least ``min_value``, so an impossible size fails at
    construction with ``BadParamError`` instead of building a zero-channel layer."""
    for name, (value, min_value) in limits.items():
        if isinstance(value, (tuple, list)):
            _pair(op, name, value, min_value=min_value)
        else:
            _check_int(op, name, value, min_value=min_value)


@_torch.jit.unused
@_asserts_like_mmcv
def _call_psamask(input: _Tensor, psa_type: str, mask_size) -> _Tensor:  # mask_size as given (int, pair, None)
    return _psamask(input, psa_type, mask_size)


@_torch.jit.unused
@_asserts_like_mmcv
def _call_carafe(features: _Tensor, masks: _Tensor, kernel_size: int, group_size: int, scale_factor: int) -> _Tensor:
    return _carafe(features, masks, kernel_size, group_size, scale_factor)


@_torch.jit.unused
@_asserts_like_mmcv
def _call_masked_conv2d(input: _Tensor, mask: _Tensor, weight: _Tensor, bias: _Optional[_Tensor], padding: _List[int],
                        stride: _List[int], dilation: _List[int], groups: int) -> _Tensor:
    return _masked_conv2d(input, mask, weight, bias, padding, stride, dilation, groups)


@_torch.jit.unused
def _check_channels(module: str, input: _Tensor, channels: int) -> None:
    """A module whose first layer is a torch conv: its input checked here, so that a wrong input names the
    module's argument instead of failing inside torch's conv."""
    _require(input.dim() == 4 and input.shape[1] == channels, module,
            f"input must be [N, channels={channels}, H, W], got {tuple(input.shape)}")


for _name in ("_call_psamask", "_call_carafe", "_call_masked_conv2d", "_check_channels"):
    _torch.fx.wrap(_name)


def _script_require(ok: bool, message: str) -> None:
    """The scripted path's check: TorchScript raises it as ``torch.jit.Error`` carrying the message."""
    if not ok:
        raise ValueError(message)


def _script_mask_hw(mask_size) -> _Tuple[int, int]:
    """``(h_mask, w_mask)`` for the scripted path; ``(0, 0)`` when mask_size is no int or pair of ints
    (the eager path reports it)."""
    hw = (mask_size, mask_size) if isinstance(mask_size, int) else tuple(mask_size or ())
    return hw if len(hw) == 2 and all(type(v) is int for v in hw) else (0, 0)


def _script_psamask(input: _Tensor, psa_code: int, h_mask: int, w_mask: int) -> _Tensor:
    _script_require(h_mask >= 1 and w_mask >= 1, "psamask: mask_size must be an int or a pair of ints >= 1")
    _script_require(input.dim() == 4 and input.is_floating_point(), "psamask: input must be a 4-D floating tensor")
    _script_require(input.size(1) == h_mask * w_mask, "psamask: input channels must equal h_mask * w_mask")
    return _torch.ops.cvops.psamask_forward(input, psa_code, h_mask, w_mask, "NCHW", None)


def _script_carafe(features: _Tensor, masks: _Tensor, k: int, g: int, s: int) -> _Tensor:
    _script_require(features.dim() == 4 and masks.dim() == 4 and features.is_floating_point()
                    and masks.dtype == features.dtype, "carafe: features and masks must be 4-D, one floating dtype")
    _script_require(k >= 1 and k % 2 == 1 and g >= 1 and s >= 1,
                    "carafe: kernel_size must be odd and >= 1, group_size and scale_factor >= 1")
    n, c, h, w = features.shape
    _script_require(masks.shape == [n, g * k * k, h * s, w * s] and c % g == 0,
                    "carafe: masks must be [N, group_size * kernel_size^2, H * scale, W * scale], C % group_size == 0")
    return _torch.ops.cvops.carafe_forward(features, masks, k, g, s, "NCHW", None)


def _script_masked_conv2d(input: _Tensor, mask: _Tensor, weight: _Tensor, bias: _Optional[_Tensor],
                          padding: _List[int]) -> _Tensor:
    _script_require(input.dim() == 4 and input.size(0) == 1 and mask.dim() == 3 and mask.size(0) == 1
                    and input.shape[2:] == mask.shape[1:], "masked_conv2d: input [1, C, H, W] needs mask [1, H, W]")
    out_channels, _, kernel_h, kernel_w = weight.shape
    _script_require(weight.size(1) == input.size(1), "masked_conv2d: weight in-channels must equal input channels")
    out_h, out_w = input.size(2) + 2 * padding[0] - kernel_h + 1, input.size(3) + 2 * padding[1] - kernel_w + 1
    _script_require(out_h > 0 and out_w > 0, "masked_conv2d: kernel larger than the padded input")
    points = _torch.nonzero(mask[0] > 0)
    h_idx, w_idx = points[:, 0].contiguous(), points[:, 1].contiguous()
    col = _torch.ops.cvops.masked_im2col(input, h_idx, w_idx, kernel_h, kernel_w, padding[0], padding[1], None)
    out = weight.reshape(out_channels, -1).mm(col) if bias is None else \
        _torch.addmm(bias[:, None], weight.reshape(out_channels, -1), col)
    return _torch.ops.cvops.masked_col2im(out, h_idx, w_idx, out_h, out_w, None)


class CARAFE(_nn.Module):
    """CARAFE, Content-Aware ReAssembly of FEatures (mmcv ``CARAFE``; arXiv:1905.02188), with an odd
    reassembly kernel ``k``, ``G`` mask groups and upsampling ratio ``s``:
    ``forward(features [N, C, H, W], masks [N, G*k*k, sH, sW]) -> [N, C, sH, sW]``."""

    @_asserts_like_mmcv
    def __init__(self, kernel_size: int, group_size: int, scale_factor: int):
        super().__init__()
        self.kernel_size, self.group_size, self.scale_factor = _carafe_checks.check_params(
            kernel_size, group_size, scale_factor, type(self).__name__)

    def forward(self, features: _Tensor, masks: _Tensor) -> _Tensor:
        if _torch.jit.is_scripting():
            return _script_carafe(features, masks, self.kernel_size, self.group_size, self.scale_factor)
        return _call_carafe(features, masks, self.kernel_size, self.group_size, self.scale_factor)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, group_size={self.group_size}, scale_factor={self.scale_factor}"


class CARAFENaive(CARAFE):
    """mmcv ``CARAFENaive``: the same function as :class:`CARAFE` (mmcv's two CUDA kernels differ only in
    speed; :func:`cvops.carafe_naive` is :func:`cvops.carafe`)."""


class CARAFEPack(_nn.Module):
    """mmcv's CARAFE upsampler: channel compressor (1x1 conv to ``compressed_channels``), content encoder
    (an ``encoder_kernel`` conv predicting ``up_kernel^2 * up_group * scale^2`` channels), pixel shuffle,
    softmax over the ``k*k`` taps, then :func:`cvops.carafe`:
    ``forward(x [N, channels, H, W]) -> [N, channels, H*scale, W*scale]``."""

    def __init__(self, channels: int, scale_factor: int, up_kernel: int = 5, up_group: int = 1,
                 encoder_kernel: int = 3, encoder_dilation: int = 1, compressed_channels: int = 64):
        super().__init__()
        op = "CARAFEPack"
        _check_sizes(op, channels=(channels, 1), encoder_kernel=(encoder_kernel, 1),
                     encoder_dilation=(encoder_dilation, 1), compressed_channels=(compressed_channels, 1))
        _carafe_checks.check_params(up_kernel, up_group, scale_factor, op)
        _require(encoder_kernel % 2 == 1, op,
                f"encoder_kernel must be odd (the encoder keeps the spatial size), got {encoder_kernel}")
        _require(channels % up_group == 0, op, f"channels ({channels}) must be divisible by up_group ({up_group})")
        self.channels = channels
        self.scale_factor = scale_factor
        self.up_kernel = up_kernel
        self.up_group = up_group
        self.encoder_kernel = encoder_kernel
        self.encoder_dilation = encoder_dilation
        self.compressed_channels = compressed_channels
        self.channel_compressor = _nn.Conv2d(channels, compressed_channels, 1)
        self.content_encoder = _nn.Conv2d(
            compressed_channels, up_kernel * up_kernel * up_group * scale_factor * scale_factor, encoder_kernel,
            padding=int((encoder_kernel - 1) * encoder_dilation / 2), dilation=encoder_dilation, groups=1)
        self.init_weights()

    def init_weights(self) -> None:
        # mmcv: xavier (uniform, gain 1, zero bias) for every conv, then normal(std=0.001) for the encoder
        for m in self.modules():
            if isinstance(m, _nn.Conv2d):
                _nn.init.xavier_uniform_(m.weight, gain=1)
                _nn.init.constant_(m.bias, 0)
        _nn.init.normal_(self.content_encoder.weight, mean=0, std=0.001)
        _nn.init.constant_(self.content_encoder.bias, 0)

    def kernel_normalizer(self, mask: _Tensor) -> _Tensor:
        mask = _torch.nn.functional.pixel_shuffle(mask, self.scale_factor)
        n, mask_c, h, w = mask.size()
        mask = mask.view(n, mask_c // (self.up_kernel * self.up_kernel), -1, h, w)
        mask = _torch.nn.functional.softmax(mask, dim=2, dtype=mask.dtype)
        return mask.view(n, mask_c, h, w).contiguous()

    def feature_reassemble(self, x: _Tensor, mask: _Tensor) -> _Tensor:
        if _torch.jit.is_scripting():
            return _script_carafe(x, mask, self.up_kernel, self.up_group, self.scale_factor)
        return _call_carafe(x, mask, self.up_kernel, self.up_group, self.scale_factor)

    def forward(self, x: _Tensor) -> _Tensor:
        if not _torch.jit.is_scripting():
            _check_channels("CARAFEPack", x, self.channels)
        mask = self.content_encoder(self.channel_compressor(x))
        return self.feature_reassemble(x, self.kernel_normalizer(mask))


class MaskedConv2d(_nn.Conv2d):
    """mmcv's ``MaskedConv2d``: a ``Conv2d`` evaluated only where ``mask > 0``, trainable here.

    ``forward(input, mask=None)``: without a mask it is the plain ``Conv2d``; with ``mask [1, H, W]``
    (``input [1, C, H, W]``) the output ``[1, O, H + 2p - kh + 1, W + 2p - kw + 1]`` holds
    ``bias + W * window`` at the mask points and exact zeros elsewhere (mmcv adds no bias there).
    The masked path needs stride, dilation and groups of 1 and has a backward for input, weight
    and bias (mmcv's has none).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        _check_sizes("MaskedConv2d", in_channels=(in_channels, 1), out_channels=(out_channels, 1),
                     kernel_size=(kernel_size, 1), stride=(stride, 1), dilation=(dilation, 1), groups=(groups, 1),
                     **({} if isinstance(padding, str) else {"padding": (padding, 0)}))
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)

    def forward(self, input: _Tensor, mask: _Optional[_Tensor] = None) -> _Tensor:
        if mask is None:
            return self._conv_forward(input, self.weight, self.bias)
        if _torch.jit.is_scripting():
            _script_require(self.stride == (1, 1) and self.dilation == (1, 1) and self.groups == 1,
                            "masked_conv2d: the masked path needs stride, dilation and groups of 1")
            return _script_masked_conv2d(input, mask, self.weight, self.bias, list(self.padding))
        return _call_masked_conv2d(input, mask, self.weight, self.bias, list(self.padding), list(self.stride),
                                   list(self.dilation), self.groups)


class PSAMask(_nn.Module):
    """PSANet's point-wise spatial attention mask (mmcv ``PSAMask``), ``psa_type`` ``"collect"`` or
    ``"distribute"``, ``mask_size`` ``(h_mask, w_mask)`` or one int: ``[N, h_mask*w_mask, H, W] -> [N, H*W, H, W]``."""

    @_asserts_like_mmcv
    def __init__(self, psa_type: str, mask_size=None):
        super().__init__()
        self.psa_code = _psamask_checks.psa_type_code(psa_type)  # reject unknown modes at construction, as mmcv does
        _pair(_psamask_checks.OP, "mask_size", mask_size, min_value=1)  # and sizes no input could match
        self.psa_type = psa_type
        self.mask_size = mask_size
        self.mask_hw = _script_mask_hw(mask_size)

    def forward(self, input: _Tensor) -> _Tensor:
        if _torch.jit.is_scripting():
            return _script_psamask(input, self.psa_code, self.mask_hw[0], self.mask_hw[1])
        return _call_psamask(input, self.psa_type, self.mask_size)

    def extra_repr(self) -> str:
        return f"psa_type={self.psa_type!r}, mask_size={self.mask_size}"


def _rois_from_boxes(boxes, op: str) -> _torch.Tensor:
    """``Tensor[R, 5]`` as given, or a list of per-image ``Tensor[L_i, 4]`` (torchvision) -> ``[R, 5]``."""
    if isinstance(boxes, _torch.Tensor):
        return boxes
    _require(isinstance(boxes, (list, tuple)) and all(isinstance(b, _torch.Tensor) for b in boxes), op,
            "rois must be a Tensor[R, 5] or a list of Tensor[L_i, 4]")
    for i, b in enumerate(boxes):
        _require(b.dim() == 2 and b.shape[1] == 4, op, f"boxes[{i}] must be [L, 4], got {tuple(b.shape)}")
    if not boxes:
        return _torch.zeros((0, 5))
    # one dtype for all, by torch's type promotion (as torch.cat of the list): a float16 first box must not
    # round the float32 boxes after it
    dtype = _functools.reduce(_torch.promote_types, [b.dtype for b in boxes])
    device = boxes[0].device
    index = _torch.cat([_torch.full((b.shape[0], 1), i, dtype=dtype, device=device) for i, b in enumerate(boxes)])
    return _torch.cat((index, _torch.cat([b.to(dtype) for b in boxes])), 1)


@_torch.fx.wrap
@_torch.jit.ignore
def _psroi_pool_layer(input: _torch.Tensor, rois: _Union[_torch.Tensor, _List[_torch.Tensor]],
                      pooled_size: _Tuple[int, int], spatial_scale: float, group_size: int,
                      output_dim: _Optional[int]) -> _Tuple[_torch.Tensor, _torch.Tensor]:
    """:class:`PSRoIPool`'s call: a leaf for ``torch.fx`` and plain Python under TorchScript (the checks it runs
    are not scriptable); ``torch.export`` / ``torch.compile`` trace through it to the custom op."""
    ph, pw = pooled_size
    if output_dim is None and isinstance(input, _torch.Tensor) and input.dim() == 4:
        output_dim = max(input.shape[1] // (ph * pw), 1)
    return _psroi_pool(input, _rois_from_boxes(rois, _psroipool_checks.OP), ph, pw, spatial_scale, group_size,
                       output_dim)


class PSRoIPool(_nn.Module):
    """Position-sensitive RoI average pooling of R-FCN (torchvision ``PSRoIPool`` names, R-FCN numerics; for
    torchvision's numerics use :class:`cvops.torchvision.PSRoIPool`).

    ``pooled_size`` is ``PH`` or ``(PH, PW)`` (or torchvision's ``output_size=``); ``group_size=None`` means
    ``PH``; ``output_dim=None`` infers ``C // (PH * PW)``; ``keep_mapping`` keeps the last ``mapping_channel``
    on ``self.last_mapping_channel``. ``forward(input [N, output_dim * PH * PW, H, W], rois)`` with rois a
    ``Tensor[R, 5]`` ``(batch_index, x1, y1, x2, y2)`` or a list of ``Tensor[L_i, 4]`` -> ``[R, output_dim, PH, PW]``.
    """

    last_mapping_channel: _Optional[_torch.Tensor]

    def __init__(self, pooled_size=None, spatial_scale: float = None, group_size=None, output_dim=None,
                 keep_mapping: bool = False, *, output_size=None):
        super().__init__()
        OP = _psroipool_checks.OP
        _require((pooled_size is None) != (output_size is None), OP,
                "give pooled_size (or torchvision's name output_size), exactly once")
        _require(spatial_scale is not None, OP, "spatial_scale is required")
        pooled_size = pooled_size if output_size is None else output_size
        self.pooled_size = _pair(OP, "pooled_size", pooled_size, min_value=1)
        ph, pw = self.pooled_size
        self.group_size = ph if group_size is None else group_size
        _psroipool_checks.check_pool_params(OP, ph, pw, spatial_scale, 1 if output_dim is None else output_dim,
                                            self.group_size)
        self.spatial_scale = float(spatial_scale)
        self.output_dim = output_dim
        self.keep_mapping = keep_mapping
        self.last_mapping_channel = None

    def forward(self, input: _torch.Tensor, rois: _Union[_torch.Tensor, _List[_torch.Tensor]]) -> _torch.Tensor:
        pooled = _psroi_pool_layer(input, rois, self.pooled_size, self.spatial_scale, self.group_size,
                                   self.output_dim)
        if self.keep_mapping:
            self.last_mapping_channel = pooled[1]
        return pooled[0]

    def extra_repr(self) -> str:
        return (f"pooled_size={self.pooled_size}, spatial_scale={self.spatial_scale}, "
                f"group_size={self.group_size}, output_dim={self.output_dim}")
