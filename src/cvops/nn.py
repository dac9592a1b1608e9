"""``torch.nn`` modules with mmcv/torchvision names and signatures."""
from typing import List, Optional, Tuple, Union

import torch
from torch import nn

import cvops


def _carafe_int(name: str, value) -> int:
    from ._core.errors import BadParamError
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadParamError("CARAFE", f"{name} must be an int, got {value!r}")
    return value


class CARAFE(nn.Module):
    """CARAFE: Content-Aware ReAssembly of FEatures (mmcv ``CARAFE``; arXiv:1905.02188).

    Args:
        kernel_size: reassembly kernel size ``k`` (odd).
        group_size: mask groups ``G`` (channels must be divisible by it).
        scale_factor: upsampling ratio ``s``.

    ``forward(features [N, C, H, W], masks [N, G*k*k, sH, sW]) -> [N, C, sH, sW]``.
    """

    def __init__(self, kernel_size: int, group_size: int, scale_factor: int):
        super().__init__()
        self.kernel_size = _carafe_int("kernel_size", kernel_size)
        self.group_size = _carafe_int("group_size", group_size)
        self.scale_factor = _carafe_int("scale_factor", scale_factor)

    def forward(self, features: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return cvops.carafe(features, masks, self.kernel_size, self.group_size, self.scale_factor)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, group_size={self.group_size}, scale_factor={self.scale_factor}"


class CARAFENaive(CARAFE):
    """mmcv ``CARAFENaive``: the same function as :class:`CARAFE` (mmcv's two CUDA kernels differ only in speed)."""

    def forward(self, features: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return cvops.carafe_naive(features, masks, self.kernel_size, self.group_size, self.scale_factor)


class CARAFEPack(nn.Module):
    """The CARAFE upsampler of mmcv: channel compressor (1x1 conv), content encoder (conv predicting
    ``up_kernel^2 * up_group * scale^2`` channels), pixel shuffle, softmax over the ``k*k`` taps, then
    :func:`cvops.carafe`.

    Args:
        channels: input channels ``C``.
        scale_factor: upsampling ratio.
        up_kernel: reassembly kernel size (default 5).
        up_group: reassembly groups (default 1).
        encoder_kernel: content-encoder kernel size (default 3).
        encoder_dilation: content-encoder dilation (default 1).
        compressed_channels: channels after the compressor (default 64).

    ``forward(x [N, C, H, W]) -> [N, C, H*scale, W*scale]``.
    """

    def __init__(self, channels: int, scale_factor: int, up_kernel: int = 5, up_group: int = 1,
                 encoder_kernel: int = 3, encoder_dilation: int = 1, compressed_channels: int = 64):
        super().__init__()
        self.channels = channels
        self.scale_factor = scale_factor
        self.up_kernel = up_kernel
        self.up_group = up_group
        self.encoder_kernel = encoder_kernel
        self.encoder_dilation = encoder_dilation
        self.compressed_channels = compressed_channels
        self.channel_compressor = nn.Conv2d(channels, compressed_channels, 1)
        self.content_encoder = nn.Conv2d(
            compressed_channels, up_kernel * up_kernel * up_group * scale_factor * scale_factor, encoder_kernel,
            padding=int((encoder_kernel - 1) * encoder_dilation / 2), dilation=encoder_dilation, groups=1)
        self.init_weights()

    def init_weights(self) -> None:
        # mmcv: xavier (uniform, gain 1, zero bias) for every conv, then normal(std=0.001) for the encoder
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight, gain=1)
                nn.init.constant_(m.bias, 0)
        nn.init.normal_(self.content_encoder.weight, mean=0, std=0.001)
        nn.init.constant_(self.content_encoder.bias, 0)

    def kernel_normalizer(self, mask: torch.Tensor) -> torch.Tensor:
        mask = torch.nn.functional.pixel_shuffle(mask, self.scale_factor)
        n, mask_c, h, w = mask.size()
        mask = mask.view(n, mask_c // (self.up_kernel ** 2), -1, h, w)
        mask = torch.nn.functional.softmax(mask, dim=2, dtype=mask.dtype)
        return mask.view(n, mask_c, h, w).contiguous()

    def feature_reassemble(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return cvops.carafe(x, mask, self.up_kernel, self.up_group, self.scale_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.content_encoder(self.channel_compressor(x))
        return self.feature_reassemble(x, self.kernel_normalizer(mask))
class MaskedConv2d(nn.Conv2d):
    """mmcv's ``MaskedConv2d``: a ``Conv2d`` evaluated only where ``mask > 0``, trainable here.

    ``forward(input, mask=None)``: without a mask it is the plain ``Conv2d``; with ``mask [1, H, W]``
    (``input [1, C, H, W]``) the output ``[1, O, H + 2p - kh + 1, W + 2p - kw + 1]`` holds
    ``bias + W * window`` at the mask points and exact zeros elsewhere (mmcv adds no bias there).
    The masked path needs stride, dilation and groups of 1 and has a backward for input, weight
    and bias (mmcv's has none).
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)

    def forward(self, input, mask=None):
        if mask is None:
            return super().forward(input)
        return cvops.masked_conv2d(input, mask, self.weight, self.bias, self.padding, self.stride,
                                   self.dilation, self.groups)
class PSAMask(nn.Module):
    """PSANet's point-wise spatial attention mask (mmcv ``PSAMask``).

    Args:
        psa_type: ``"collect"`` or ``"distribute"``.
        mask_size: ``(h_mask, w_mask)`` or one int.

    Shape: input ``[N, h_mask*w_mask, H, W]`` -> output ``[N, H*W, H, W]``.
    """

    def __init__(self, psa_type: str, mask_size=None):
        super().__init__()
        from .ops.psamask.checks import psa_type_code
        psa_type_code(psa_type)  # reject unknown modes at construction, as mmcv does
        self.psa_type = psa_type
        self.mask_size = mask_size

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return cvops.psamask(input, self.psa_type, self.mask_size)

    def extra_repr(self) -> str:
        return f"psa_type={self.psa_type!r}, mask_size={self.mask_size}"


def _rois_from_boxes(boxes, op: str) -> torch.Tensor:
    """``Tensor[R, 5]`` as given, or a list of per-image ``Tensor[L_i, 4]`` (torchvision) -> ``[R, 5]``."""
    if isinstance(boxes, torch.Tensor):
        return boxes
    from ._core.validate import require
    require(isinstance(boxes, (list, tuple)) and all(isinstance(b, torch.Tensor) for b in boxes), op,
            "rois must be a Tensor[R, 5] or a list of Tensor[L_i, 4]")
    for i, b in enumerate(boxes):
        require(b.dim() == 2 and b.shape[1] == 4, op, f"boxes[{i}] must be [L, 4], got {tuple(b.shape)}")
    if not boxes:
        return torch.zeros((0, 5))
    dtype, device = boxes[0].dtype, boxes[0].device
    index = torch.cat([torch.full((b.shape[0], 1), i, dtype=dtype, device=device) for i, b in enumerate(boxes)])
    return torch.cat((index, torch.cat([b.to(dtype) for b in boxes])), 1)


@torch.fx.wrap
@torch.jit.ignore
def _psroi_pool_layer(input: torch.Tensor, rois: Union[torch.Tensor, List[torch.Tensor]],
                      pooled_size: Tuple[int, int], spatial_scale: float, group_size: int,
                      output_dim: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """:class:`PSRoIPool`'s call: a leaf for ``torch.fx`` and plain Python under TorchScript (the checks it runs
    are not scriptable); ``torch.export`` / ``torch.compile`` trace through it to the custom op."""
    from .ops.psroipool.checks import OP
    ph, pw = pooled_size
    if output_dim is None and isinstance(input, torch.Tensor) and input.dim() == 4:
        output_dim = max(input.shape[1] // (ph * pw), 1)
    return cvops.psroi_pool(input, _rois_from_boxes(rois, OP), ph, pw, spatial_scale, group_size, output_dim)


class PSRoIPool(nn.Module):
    """Position-sensitive RoI average pooling of R-FCN (torchvision ``PSRoIPool`` names, R-FCN numerics; for
    torchvision's numerics use :class:`cvops.torchvision.PSRoIPool`).

    Args:
        pooled_size: ``PH`` or ``(PH, PW)`` (``output_size=`` as in torchvision is accepted too).
        spatial_scale: image-to-feature scale (e.g. 1/16).
        group_size: R-FCN group size; ``None`` means ``PH`` (must equal PH when PH == PW).
        output_dim: output channels; ``None`` infers ``C // (PH * PW)`` from the input.
        keep_mapping: keep the last ``mapping_channel`` on ``self.last_mapping_channel``.

    Shape: input ``[N, C, H, W]`` with ``C = output_dim * PH * PW``; rois ``Tensor[R, 5]``
    ``(batch_index, x1, y1, x2, y2)`` or a list of per-image ``Tensor[L_i, 4]`` -> ``[R, output_dim, PH, PW]``.
    Works under ``torch.jit.script``, ``torch.fx.symbolic_trace``, ``torch.export.export`` and ``torch.compile``.
    """

    last_mapping_channel: Optional[torch.Tensor]

    def __init__(self, pooled_size=None, spatial_scale: float = None, group_size=None, output_dim=None,
                 keep_mapping: bool = False, *, output_size=None):
        super().__init__()
        from .ops.psroipool.checks import OP, check_pool_params
        from ._core.validate import pair, require
        require((pooled_size is None) != (output_size is None), OP,
                "give pooled_size (or torchvision's name output_size), exactly once")
        require(spatial_scale is not None, OP, "spatial_scale is required")
        pooled_size = pooled_size if output_size is None else output_size
        self.pooled_size = pair(OP, "pooled_size", pooled_size, min_value=1)
        ph, pw = self.pooled_size
        self.group_size = ph if group_size is None else group_size
        check_pool_params(OP, ph, pw, spatial_scale, 1 if output_dim is None else output_dim, self.group_size)
        self.spatial_scale = float(spatial_scale)
        self.output_dim = output_dim
        self.keep_mapping = keep_mapping
        self.last_mapping_channel = None

    def forward(self, input: torch.Tensor, rois: Union[torch.Tensor, List[torch.Tensor]]) -> torch.Tensor:
        pooled = _psroi_pool_layer(input, rois, self.pooled_size, self.spatial_scale, self.group_size,
                                   self.output_dim)
        if self.keep_mapping:
            self.last_mapping_channel = pooled[1]
        return pooled[0]

    def extra_repr(self) -> str:
        return (f"pooled_size={self.pooled_size}, spatial_scale={self.spatial_scale}, "
                f"group_size={self.group_size}, output_dim={self.output_dim}")
