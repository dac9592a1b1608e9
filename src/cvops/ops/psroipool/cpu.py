"""psroipool in vectorised torch: summed-area tables, so every bin costs O(1) whatever its size.

The input is regrouped once as ``[N, K, H+1, W+1, output_dim]`` (K = PH*PW channel groups, input channel
``ctop*K + k``) and integrated over H and W in float64. A bin's sums over all ``output_dim`` channels are
then four contiguous rows of that table: ``S[he,we] - S[hs,we] - S[he,ws] + S[hs,ws]``. The backward is
the adjoint: each top element adds ``grad / area`` at the four corners of a difference table (a
sequential ``index_add_``, deterministic) which two cumulative sums turn into ``bottom_grad``.

Non-finite values would poison a summed-area table for every later bin, so when any is present the
table holds the finite values and separate count tables of NaN, +inf and -inf decide those bins.
"""
from __future__ import annotations

import torch

from ..._core.layout import empty_nchw
from . import checks


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Bin-edge arithmetic dtype: R-FCN's ``Dtype`` (float32, float64 for float64 input)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    t = torch.trunc(v)
    return torch.where((v - t).abs() >= 0.5, t + torch.sign(v), t)


def _to_index(v: torch.Tensor, limit: int) -> torch.Tensor:
    return torch.nan_to_num(v, nan=0.0).clamp_(0, limit).to(torch.int64)


def bin_edges(rois: torch.Tensor, pooled_height: int, pooled_width: int, spatial_scale: float,
              height: int, width: int, dtype: torch.dtype):
    """hs, he [R, PH] and ws, we [R, PW] (int64, clamped) and batch [R] (int64), R-FCN arithmetic."""
    r = rois.to(dtype)
    scale = torch.tensor(spatial_scale, dtype=dtype, device=rois.device)
    one = torch.tensor(1, dtype=dtype, device=rois.device)
    start_w = _round_half_away(r[:, 1]) * scale
    start_h = _round_half_away(r[:, 2]) * scale
    end_w = (_round_half_away(r[:, 3]) + one) * scale
    end_h = (_round_half_away(r[:, 4]) + one) * scale
    min_size = torch.tensor(0.1, dtype=dtype, device=rois.device)
    roi_w = torch.maximum(end_w - start_w, min_size)  # NaN stays NaN, as in the reference
    roi_h = torch.maximum(end_h - start_h, min_size)
    bin_h = (roi_h / pooled_height)[:, None]
    bin_w = (roi_w / pooled_width)[:, None]
    ph = torch.arange(pooled_height + 1, dtype=dtype, device=rois.device)
    pw = torch.arange(pooled_width + 1, dtype=dtype, device=rois.device)
    h_lo = ph[:-1] * bin_h + start_h[:, None]
    h_hi = ph[1:] * bin_h + start_h[:, None]
    w_lo = pw[:-1] * bin_w + start_w[:, None]
    w_hi = pw[1:] * bin_w + start_w[:, None]
    hs, he = _to_index(torch.floor(h_lo), height), _to_index(torch.ceil(h_hi), height)
    ws, we = _to_index(torch.floor(w_lo), width), _to_index(torch.ceil(w_hi), width)
    batch = torch.trunc(r[:, 0]).nan_to_num_(nan=0.0).to(torch.int64)
    return hs, he, ws, we, batch


def _corner_rows(hs, he, ws, we, batch, groups: int, height: int, width: int) -> torch.Tensor:
    """Row indices [4, R, PH, PW] into the ``[N*K*(H+1)*(W+1), od]`` table, corners in the order
    (hs,ws), (hs,we), (he,ws), (he,we)."""
    r, ph_n = hs.shape
    pw_n = ws.shape[1]
    k = torch.arange(ph_n * pw_n, device=hs.device).view(1, ph_n, pw_n)
    plane = (batch.view(r, 1, 1) * groups + k) * (height + 1)  # [R, PH, PW]
    rows_s = (plane + hs[:, :, None]) * (width + 1)
    rows_e = (plane + he[:, :, None]) * (width + 1)
    w_s, w_e = ws[:, None, :], we[:, None, :]
    return torch.stack((rows_s + w_s, rows_s + w_e, rows_e + w_s, rows_e + w_e))


def _grouped(t_nchw: torch.Tensor, groups: int) -> torch.Tensor:
    """[N, C, H, W] -> view [N, K, H, W, od] with channel ``ctop*K + k`` (no copy)."""
    n, c, h, w = t_nchw.shape
    return t_nchw.unflatten(1, (c // groups, groups)).permute(0, 2, 3, 4, 1)


def _integral(values: torch.Tensor) -> torch.Tensor:
    """[N, K, H, W, od] -> float64 summed-area table [N, K, H+1, W+1, od] with a zero border."""
    n, k, h, w, od = values.shape
    table = torch.zeros((n, k, h + 1, w + 1, od), dtype=torch.float64, device=values.device)
    table[:, :, 1:, 1:].copy_(values)
    table.cumsum_(2)
    table.cumsum_(3)
    return table


def _box_sums(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    od = table.shape[-1]
    v = table.view(-1, od).index_select(0, rows.view(-1)).view(4, -1, od)
    return (v[3] - v[1]) - (v[2] - v[0])


def forward(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
            spatial_scale: float, output_dim: int, out_layout: str = "NCHW"):
    """(output, mapping_channel int32) as logical NCHW views of tensors stored in ``out_layout``."""
    n, c, h, w = input.shape
    r = rois.shape[0]
    ph_n, pw_n, od = pooled_height, pooled_width, output_dim
    groups = ph_n * pw_n
    output = empty_nchw((r, od, ph_n, pw_n), out_layout, like=input)
    mapping = empty_nchw((r, od, ph_n, pw_n), out_layout, like=input.new_empty(0, dtype=torch.int32))
    chan = torch.arange(od * groups, dtype=torch.int32, device=input.device).view(1, od, ph_n, pw_n)
    mapping.copy_(chan.expand(r, od, ph_n, pw_n))
    if input.numel() == 0 or r == 0:
        output.zero_()
        return output, mapping
    checks.check_batch_indices(checks.OP, rois, n)
    hs, he, ws, we, batch = bin_edges(rois, ph_n, pw_n, spatial_scale, h, w, compute_dtype(input.dtype))
    rows = _corner_rows(hs, he, ws, we, batch, groups, h, w)
    area = ((he - hs)[:, :, None] * (we - ws)[:, None, :]).clamp_(min=1).view(-1, 1)  # empty bins sum to 0

    grouped = _grouped(input, groups)
    finite = bool(torch.isfinite(grouped).all())
    values = grouped if finite else torch.nan_to_num(grouped, nan=0.0, posinf=0.0, neginf=0.0)
    sums = _box_sums(_integral(values), rows)
    result = sums / area  # [R*PH*PW, od]
    if not finite:
        nan_n = _box_sums(_integral(torch.isnan(grouped)), rows)
        pos_n = _box_sums(_integral(grouped == float("inf")), rows)
        neg_n = _box_sums(_integral(grouped == float("-inf")), rows)
        result = torch.where(pos_n > 0, float("inf"), result)
        result = torch.where(neg_n > 0, float("-inf"), result)
        result = torch.where((nan_n > 0) | ((pos_n > 0) & (neg_n > 0)), float("nan"), result)
    output.copy_(result.view(r, ph_n, pw_n, od).permute(0, 3, 1, 2))
    return output, mapping


def _is_canonical(mapping_channel: torch.Tensor) -> bool:
    r, od, ph_n, pw_n = mapping_channel.shape
    chan = torch.arange(od * ph_n * pw_n, device=mapping_channel.device).view(1, od, ph_n, pw_n)
    return bool((mapping_channel == chan).all())


def backward(top_grad: torch.Tensor, rois: torch.Tensor, mapping_channel: torch.Tensor, spatial_scale: float,
             output_dim: int, input_shape, out_layout: str = "NCHW"):
    """bottom_grad (logical NCHW view of a tensor stored in ``out_layout``)."""
    n, c, h, w = input_shape
    r, od, ph_n, pw_n = top_grad.shape
    groups = ph_n * pw_n
    bottom = empty_nchw((n, c, h, w), out_layout, like=top_grad)
    if top_grad.numel() == 0 or bottom.numel() == 0:
        return bottom.zero_()
    checks.check_batch_indices(checks.OP_BACKWARD, rois, n)
    checks.check_mapping_values(checks.OP_BACKWARD, mapping_channel, c)
    hs, he, ws, we, batch = bin_edges(rois, ph_n, pw_n, spatial_scale, h, w, compute_dtype(top_grad.dtype))
    rows = _corner_rows(hs, he, ws, we, batch, groups, h, w)  # [4, R, PH, PW]
    area = ((he - hs)[:, :, None] * (we - ws)[:, None, :]).view(r, 1, ph_n, pw_n)
    empty = area == 0

    grad = top_grad.to(torch.float64)
    finite = bool(torch.isfinite(grad).all())
    scaled = grad if finite else torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
    # every table is masked on empty bins, whose four corners would only cancel up to rounding
    contribs = [(scaled / area.clamp(min=1)).masked_fill_(empty, 0.0)]
    if not finite:
        contribs += [m.to(torch.float64).masked_fill_(empty, 0.0)
                     for m in (torch.isnan(grad), grad == float("inf"), grad == float("-inf"))]
    contribs.append(torch.ones_like(grad).masked_fill_(empty, 0.0))  # coverage: exact zeros elsewhere

    sign = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64, device=grad.device)
    plane = (h + 1) * (w + 1)
    if _is_canonical(mapping_channel):
        # whole rows of od channels: (r, ph, pw) -> row, ctop -> column
        index, width_of_row = rows.reshape(-1), od
        def spread(contrib):
            return (contrib.permute(0, 2, 3, 1).reshape(1, r * groups, od) * sign.view(4, 1, 1)).view(-1, od)
    else:
        # any channel: split it into (ctop, k), add element by element
        ch = mapping_channel.to(torch.int64)
        ctop, k = ch // groups, ch % groups
        canonical_k = torch.arange(groups, device=rows.device).view(1, 1, ph_n, pw_n)
        b_h_w = rows - canonical_k * plane  # rows with k removed
        index = ((b_h_w[:, :, None] + (k * plane)[None]) * od + ctop[None]).reshape(-1)  # [4, R, od, PH, PW]
        width_of_row = None
        def spread(contrib):
            return (contrib[None] * sign.view(4, 1, 1, 1, 1)).reshape(-1)

    summed = []
    for contrib in contribs:
        diff = torch.zeros((n, groups, h + 1, w + 1, od), dtype=torch.float64, device=grad.device)
        target = diff.view(-1, od) if width_of_row else diff.view(-1)
        target.index_add_(0, index, spread(contrib))  # sequential on CPU: deterministic
        diff.cumsum_(2)
        diff.cumsum_(3)
        summed.append(diff[:, :, :h, :w])
    result, covered = summed[0], summed[-1] > 0.5
    if not finite:
        nan_n, pos_n, neg_n = (t > 0.5 for t in summed[1:4])
        result = torch.where(pos_n, float("inf"), result)
        result = torch.where(neg_n, float("-inf"), result)
        result = torch.where(nan_n | (pos_n & neg_n), float("nan"), result)
    result = torch.where(covered, result, 0.0)
    # [N, K, H, W, od] -> logical [N, od, K, H, W]: channel ctop*K + k
    bottom.unflatten(1, (od, groups)).copy_(result.permute(0, 4, 1, 2, 3))
    return bottom
