"""``mmcv.ops.nms``: ``nms`` and ``batched_nms`` with mmcv's signatures and results (mmdet's dense heads, GA-RetinaNet
among them, filter their detections with ``batched_nms``).

Greedy suppression in descending score order (ties keep input order): torchvision's kernel where it loads
(``offset=0``), otherwise :func:`nms_torch`.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

# absolute: the file also loads as mmcv.ops.<name>
from cvops._core.errors import asserts_like_mmcv
from cvops._core.validate import FLOAT_DTYPES, check_int, check_tensor, require, require_supported
from cvops.mmcv._torchvision import torchvision_ops


@asserts_like_mmcv
def nms(boxes, scores, iou_threshold: float, offset: int = 0, score_threshold: float = 0, max_num: int = -1):
    """mmcv ``nms``: ``boxes [N, 4]``, ``scores [N]`` (tensors or NumPy arrays) -> ``(dets [K, 5], inds [K])``,
    the kept boxes with their scores in descending score order and their indices into the input. Boxes scoring
    ``<= score_threshold`` (when it is > 0) are dropped first; ``max_num > 0`` keeps the best ``max_num``;
    ``offset`` 1 measures widths as ``x2 - x1 + 1`` (mmcv's legacy convention). Returns the input's type."""
    is_numpy = isinstance(boxes, np.ndarray)
    boxes = torch.from_numpy(boxes) if is_numpy else boxes
    scores = torch.from_numpy(scores) if isinstance(scores, np.ndarray) else scores
    check_tensor("nms", "boxes", boxes, dim=2, dtypes=FLOAT_DTYPES)
    check_tensor("nms", "scores", scores, dim=1, dtypes=FLOAT_DTYPES)
    require(boxes.shape[1] == 4, "nms", f"boxes must be [N, 4], got {list(boxes.shape)}")
    require(scores.shape[0] == boxes.shape[0], "nms",
            f"scores ({scores.shape[0]}) and boxes ({boxes.shape[0]}) must have one row per box")
    require(offset in (0, 1), "nms", f"offset must be 0 or 1, got {offset!r}")
    max_num = check_int("nms", "max_num", max_num)
    candidates = torch.arange(len(scores), device=scores.device)
    if score_threshold > 0:
        candidates = torch.nonzero(scores > score_threshold).view(-1)
    inds = candidates[_keep(boxes[candidates], scores[candidates], float(iou_threshold), offset)]
    if max_num > 0:
        inds = inds[:max_num]
    dets = torch.cat([boxes[inds], scores[inds].reshape(-1, 1).to(boxes.dtype)], dim=1)
    return (dets.cpu().numpy(), inds.cpu().numpy()) if is_numpy else (dets, inds)


def _keep(boxes: Tensor, scores: Tensor, iou_threshold: float, offset: int) -> Tensor:
    tv = torchvision_ops()
    if tv is not None and offset == 0 and boxes.dtype in (torch.float32, torch.float64) and scores.dtype == boxes.dtype:
        return tv.nms(boxes, scores, iou_threshold)
    return nms_torch(boxes, scores, iou_threshold, offset)


def nms_torch(boxes: Tensor, scores: Tensor, iou_threshold: float, offset: int = 0) -> Tensor:
    """The plain torch route of :func:`nms`: indices of the kept boxes, in descending score order."""
    order = torch.sort(scores, descending=True, stable=True).indices
    x1, y1, x2, y2 = boxes[order].unbind(1)
    areas = (x2 - x1 + offset) * (y2 - y1 + offset)
    suppressed = torch.zeros(len(order), dtype=torch.bool, device=boxes.device)
    kept = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        kept.append(i)
        rest = slice(i + 1, None)
        width = (torch.minimum(x2[i], x2[rest]) - torch.maximum(x1[i], x1[rest]) + offset).clamp(min=0)
        height = (torch.minimum(y2[i], y2[rest]) - torch.maximum(y1[i], y1[rest]) + offset).clamp(min=0)
        overlap = width * height
        suppressed[rest] |= overlap / (areas[i] + areas[rest] - overlap) > iou_threshold
    return order[torch.tensor(kept, dtype=torch.long, device=boxes.device)]


@asserts_like_mmcv
def batched_nms(boxes: Tensor, scores: Tensor, idxs: Tensor, nms_cfg: Optional[dict],
                class_agnostic: bool = False):
    """mmcv ``batched_nms``: NMS within each class ``idxs [N]`` (across classes with ``class_agnostic``, also
    settable in ``nms_cfg``) -> ``(dets [K, 5], keep [K])`` in descending score order. ``nms_cfg``: ``type``
    (``'nms'``), ``iou_threshold``, and optionally ``offset``, ``score_threshold``, ``max_num``; ``None`` sorts by
    score without suppression. Classes are kept apart as mmcv does: each class's boxes are shifted by
    ``class * (max coordinate + 1)``, so boxes of different classes never overlap."""
    check_tensor("batched_nms", "boxes", boxes, dim=2, dtypes=FLOAT_DTYPES)
    check_tensor("batched_nms", "idxs", idxs, dim=1)
    require(len(idxs) == len(boxes), "batched_nms",
            f"idxs ({len(idxs)}) and boxes ({len(boxes)}) must have one row per box")
    if nms_cfg is None:
        scores, inds = torch.sort(scores, descending=True, stable=True)
        return torch.cat([boxes[inds], scores[:, None].to(boxes.dtype)], -1), inds
    cfg = dict(nms_cfg)
    class_agnostic = cfg.pop("class_agnostic", class_agnostic)
    nms_type = cfg.pop("type", "nms")
    cfg.pop("split_thr", None)  # mmcv's switch to a per-class loop for large inputs: the same result
    nms_op = nms_type if callable(nms_type) else nms if nms_type == "nms" else None
    require_supported(nms_op is not None, "batched_nms",
                      f"nms_cfg type {nms_type!r}: cvops provides only 'nms' (or a callable with nms's signature)")
    require(boxes.shape[1] == 4, "batched_nms", f"boxes must be [N, 4] (x1, y1, x2, y2), got {list(boxes.shape)}")
    boxes_for_nms = boxes
    if not class_agnostic and len(boxes):
        boxes_for_nms = boxes + (idxs.to(boxes) * (boxes.max() + 1))[:, None]
    dets, keep = nms_op(boxes_for_nms, scores, **cfg)
    return torch.cat([boxes[keep], dets[:, -1:]], -1), keep


__all__ = ["batched_nms", "nms"]
