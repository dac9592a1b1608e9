"""mmcv.ops' layout (mmcv 2.1: each submodule and its public names) and the placeholders
:func:`cvops.mmcv.install_as_mmcv` puts where cvops has no op: they import and construct (keeping keyword
arguments as attributes, e.g. a RoI layer's ``output_size``), so model packages load and build, and raise
:class:`cvops.NotSupportedError` naming the op when called.
"""
from __future__ import annotations

import types

from torch import nn

from cvops._core.errors import NotSupportedError  # absolute: also mmcv.ops.<name>

# mmcv 2.1's mmcv.ops submodules that define one function of their own name
_SELF_NAMED = (
    "active_rotated_filter", "assign_score_withk", "ball_query", "bias_act", "box_iou_quadri", "box_iou_rotated",
    "chamfer_distance", "contour_expand", "filtered_lrelu", "gather_points", "knn", "min_area_polygons",
    "pixel_group", "points_in_polygons", "rotated_feature_align", "three_interpolate", "three_nn",
)

# mmcv 2.1's mmcv.ops submodules -> the public names each defines (those mmcv.ops exports, and the ones model
# packages import from the submodule itself, such as merge_cells' cells and the sparse base classes).
MMCV_OPS_LAYOUT = {
    **{name: (name,) for name in _SELF_NAMED},
    "bbox": ("bbox_overlaps",),
    "bezier_align": ("BezierAlign", "bezier_align"),
    "border_align": ("BorderAlign", "border_align"),
    "carafe": ("CARAFE", "CARAFENaive", "CARAFEPack", "carafe", "carafe_naive"),
    "cc_attention": ("CrissCrossAttention",),
    "conv2d_gradfix": ("conv2d", "conv_transpose2d"),
    "convex_iou": ("convex_giou", "convex_iou"),
    "corner_pool": ("CornerPool",),
    "correlation": ("Correlation",),
    "deform_conv": ("DeformConv2d", "DeformConv2dPack", "deform_conv2d"),
    "deform_roi_pool": ("DeformRoIPool", "DeformRoIPoolPack", "ModulatedDeformRoIPoolPack", "deform_roi_pool"),
    "deprecated_wrappers": ("Conv2d_deprecated", "ConvTranspose2d_deprecated", "Linear_deprecated",
                            "MaxPool2d_deprecated"),
    "diff_iou_rotated": ("diff_iou_rotated_2d", "diff_iou_rotated_3d"),
    "focal_loss": ("SigmoidFocalLoss", "SoftmaxFocalLoss", "sigmoid_focal_loss", "softmax_focal_loss"),
    "furthest_point_sample": ("furthest_point_sample", "furthest_point_sample_with_dist"),
    "fused_bias_leakyrelu": ("FusedBiasLeakyReLU", "fused_bias_leakyrelu"),
    "group_points": ("GroupAll", "QueryAndGroup", "grouping_operation"),
    "info": ("get_compiler_version", "get_compiling_cuda_version"),
    "iou3d": ("boxes_iou3d", "boxes_iou_bev", "boxes_overlap_bev", "nms3d", "nms3d_normal", "nms_bev",
              "nms_normal_bev"),
    "masked_conv": ("MaskedConv2d", "masked_conv2d"),
    "merge_cells": ("BaseMergeCell", "ConcatCell", "GlobalPoolingCell", "SumCell"),
    "modulated_deform_conv": ("ModulatedDeformConv2d", "ModulatedDeformConv2dPack", "modulated_deform_conv2d"),
    "multi_scale_deform_attn": ("MultiScaleDeformableAttention",),
    "nms": ("batched_nms", "nms", "nms_match", "nms_quadri", "nms_rotated", "soft_nms"),
    "point_sample": ("SimpleRoIAlign", "point_sample", "rel_roi_point_to_rel_img_point"),
    "points_in_boxes": ("points_in_boxes_all", "points_in_boxes_cpu", "points_in_boxes_part"),
    "points_sampler": ("PointsSampler",),
    "prroi_pool": ("PrRoIPool", "prroi_pool"),
    "psa_mask": ("PSAMask", "psa_mask"),
    "riroi_align_rotated": ("RiRoIAlignRotated", "riroi_align_rotated"),
    "roi_align": ("RoIAlign", "roi_align"),
    "roi_align_rotated": ("RoIAlignRotated", "roi_align_rotated"),
    "roi_pool": ("RoIPool", "roi_pool"),
    "roiaware_pool3d": ("RoIAwarePool3d",),
    "roipoint_pool3d": ("RoIPointPool3d",),
    "saconv": ("SAConv2d",),
    "scatter_points": ("DynamicScatter", "dynamic_scatter"),
    "sparse_conv": ("SparseConvolution", "SparseConv2d", "SparseConv3d", "SparseConv4d", "SparseConvTranspose2d",
                    "SparseConvTranspose3d", "SparseInverseConv2d", "SparseInverseConv3d", "SubMConv2d",
                    "SubMConv3d", "SubMConv4d"),
    "sparse_modules": ("SparseModule", "SparseSequential"),
    "sparse_pool": ("SparseMaxPool", "SparseMaxPool2d", "SparseMaxPool3d"),
    "sparse_structure": ("SparseConvTensor", "scatter_nd"),
    "sync_bn": ("SyncBatchNorm",),
    "tin_shift": ("TINShift", "tin_shift"),
    "upfirdn2d": ("filter2d", "upfirdn2d", "upsample2d"),
    "voxelize": ("Voxelization", "voxelization"),
}

# The names mmcv.ops registers in mmengine's MODELS registry (registry name -> mmcv.ops name).
MMCV_REGISTERED = {
    "carafe": "CARAFEPack", "CrissCrossAttention": "CrissCrossAttention", "DCN": "DeformConv2dPack",
    "DCNv2": "ModulatedDeformConv2dPack", "MultiScaleDeformableAttention": "MultiScaleDeformableAttention",
    "SAC": "SAConv2d", "MMSyncBN": "SyncBatchNorm",
    **{name: name for name in ("SparseConv2d", "SparseConv3d", "SparseConv4d", "SparseConvTranspose2d",
                               "SparseConvTranspose3d", "SparseInverseConv2d", "SparseInverseConv3d", "SubMConv2d",
                               "SubMConv3d", "SubMConv4d")},
}


def _error(path: str) -> NotSupportedError:
    return NotSupportedError(path, "cvops does not provide this op. cvops.mmcv.install_as_mmcv() puts a "
                                   "placeholder here so that code importing it loads; the ops cvops runs are "
                                   "CARAFE, MaskedConv2d, PSAMask, the sparse convolutions, DeformConv2d, nms "
                                   "and batched_nms. A compiled mmcv build provides the others.")


def placeholder(module: str, name: str):
    """A stand-in for ``mmcv.ops.<module>.<name>``: a ``torch.nn.Module`` class for a class name, else a
    function; calling it raises :class:`NotSupportedError` naming ``mmcv.ops.<name>``."""
    path = f"mmcv.ops.{name}"
    if name[:1].isupper():
        def __init__(self, *args, **kwargs):
            nn.Module.__init__(self)
            for key, value in kwargs.items():  # configuration read by code around the op
                if not key.startswith("_") and not hasattr(self, key):
                    setattr(self, key, value)

        def forward(self, *args, **kwargs):
            raise _error(path)

        return type(name, (nn.Module,), {"__init__": __init__, "forward": forward, "__module__": f"mmcv.ops.{module}",
                                         "__doc__": f"Placeholder for {path}: constructs; calling it raises."})

    def function(*args, **kwargs):
        raise _error(path)

    function.__name__ = function.__qualname__ = name
    function.__module__ = f"mmcv.ops.{module}"
    function.__doc__ = f"Placeholder for {path}: raises NotSupportedError."
    return function


def kernel_module() -> types.ModuleType:
    """``mmcv._ext``: every attribute is a kernel function that raises :class:`NotSupportedError`."""
    ext = types.ModuleType("mmcv._ext", "mmcv's compiled kernels: not provided by cvops (placeholders)")

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def kernel(*args, **kwargs):
            raise NotSupportedError(f"mmcv._ext.{name}", "cvops does not provide mmcv's compiled kernels; "
                                                         "a compiled mmcv build does")
        kernel.__name__ = name
        return kernel

    ext.__getattr__ = __getattr__
    return ext
