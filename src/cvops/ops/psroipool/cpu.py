"""psroipool in vectorised torch: summed-area tables, so every bin costs O(1) whatever its size.

Forward. The input is regrouped once as ``[N, K, H+1, W+1, od]`` (K = PH*PW channel groups; input channel
``ctop*K + k``), centred per plane (smaller magnitudes, better fp32 precision) and integrated over H and
W. A bin's ``od`` sums are then four whole rows of that table, ``S[he,we] - S[hs,we] - S[he,ws] +
S[hs,ws]``, so one ``embedding_bag`` (bags of 4 corner rows + the plane mean, weights +-1/area) yields
the output directly in ``[R, PH, PW, od]`` order.

Backward (the adjoint). Each top element adds ``grad/area`` at the four corners of a difference table
(``index_add_`` over whole rows: a sequential loop on CPU, so deterministic), which two cumulative sums
turn into ``bottom_grad``; a coverage count gives exact zeros where no bin reaches.

Non-finite values would poison every later entry of a summed-area table, so when any is present the
table holds the finite values and count tables of NaN, +inf and -inf decide those bins.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._core.layout import empty_nchw
from . import checks


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Bin-edge arithmetic and accumulation dtype: R-FCN's ``Dtype`` (float32; float64 for float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    t = torch.trunc(v)
    return torch.where((v - t).abs() >= 0.5, t + torch.sign(v), t)


def bin_edges(rois: torch.Tensor, pooled_height: int, pooled_width: int, spatial_scale: float,
              height: int, width: int, dtype: torch.dtype):
    """hs, he [R, PH], ws, we [R, PW] (int64, clamped to [0, H] / [0, W]) and batch [R] (int64).

    R-FCN arithmetic in ``dtype``, one rounding per operation as in the reference: y and x are handled
    together as the two rows of ``[R, 2, P+1]`` tensors. NaN edges become 0, +inf the limit.
    """
    dev = rois.device
    r = rois.to(dtype)
    scale = torch.tensor(spatial_scale, dtype=dtype, device=dev)
    yx1 = r[:, [2, 1]]
    yx2 = r[:, [4, 3]]
    start = _round_half_away(yx1) * scale
    end = (_round_half_away(yx2) + 1) * scale
    size = torch.maximum(end - start, torch.tensor(0.1, dtype=dtype, device=dev))  # NaN stays NaN
    bins = size / torch.tensor([pooled_height, pooled_width], dtype=dtype, device=dev)
    p = torch.arange(max(pooled_height, pooled_width) + 1, dtype=dtype, device=dev)
    edges = p * bins[:, :, None] + start[:, :, None]  # [R, 2, P+1]
    limit = torch.tensor([[height], [width]], dtype=dtype, device=dev)
    lo = torch.minimum(torch.floor(edges[:, :, :-1]).nan_to_num_(nan=0.0).clamp_(min=0), limit)
    hi = torch.minimum(torch.ceil(edges[:, :, 1:]).nan_to_num_(nan=0.0).clamp_(min=0), limit)
    lo, hi = lo.to(torch.int64), hi.to(torch.int64)
    hs, he = lo[:, 0, :pooled_height], hi[:, 0, :pooled_height]
    ws, we = lo[:, 1, :pooled_width], hi[:, 1, :pooled_width]
    batch = r[:, 0].to(torch.int64)  # C truncation; validated beforehand
    return hs, he, ws, we, batch


def _corners(hs, he, ws, we, batch, groups: int, height: int, width: int):
    """Row indices [R*PH*PW, 4] into the ``[N*K*(H+1)*(W+1), od]`` table, in the corner order
    (hs,ws), (hs,we), (he,ws), (he,we), and the bin areas [R*PH*PW] (0 for empty bins)."""
    r, ph_n = hs.shape
    pw_n = ws.shape[1]
    k = torch.arange(ph_n * pw_n, device=hs.device).view(1, ph_n, pw_n)
    plane = (batch.view(r, 1, 1) * groups + k) * (height + 1)  # [R, PH, PW]
    h_rows = torch.stack((plane + hs[:, :, None], plane + he[:, :, None]), -1) * (width + 1)  # [R,PH,PW,2]
    w_cols = torch.stack((ws, we), -1)[:, None, :, None, :]  # [R,1,PW,1,2]
    rows = (h_rows[..., :, None] + w_cols).view(-1, 4)  # (h in {s,e}) x (w in {s,e})
    area = ((he - hs)[:, :, None] * (we - ws)[:, None, :]).view(-1)
    return rows, area


_SIGNS = (1.0, -1.0, -1.0, 1.0)


def _grouped(t_nchw: torch.Tensor, groups: int) -> torch.Tensor:
    """[N, C, H, W] -> view [N, K, H, W, od] with channel ``ctop*K + k`` (no copy)."""
    c = t_nchw.shape[1]
    return t_nchw.unflatten(1, (c // groups, groups)).permute(0, 2, 3, 4, 1)


def _integral_table(values: torch.Tensor, dtype: torch.dtype, centre: bool):
    """``[N*K*(H+1)*(W+1) + N*K, od]``: the summed-area table of ``values - mean`` (zero border), followed
    by the per-plane means (rows ``n_table + plane``). ``values`` is ``[N, K, H, W, od]``."""
    n, k, h, w, od = values.shape
    n_table = n * k * (h + 1) * (w + 1)
    table = torch.empty((n_table + n * k, od), dtype=dtype, device=values.device)
    sat = table[:n_table].view(n, k, h + 1, w + 1, od)
    sat[:, :, 0].zero_()
    sat[:, :, :, 0].zero_()
    mean = table[n_table:].view(n, k, 1, 1, od)
    if centre and h * w > 0:
        torch.mean(values, dim=(2, 3), keepdim=True, dtype=dtype, out=mean)
        torch.sub(values, mean, out=sat[:, :, 1:, 1:])
    else:
        mean.zero_()
        sat[:, :, 1:, 1:].copy_(values)
    torch.cumsum(sat, 2, out=sat)
    torch.cumsum(sat, 3, out=sat)
    return table, n_table


def _pool(table: torch.Tensor, n_table: int, rows: torch.Tensor, weights: torch.Tensor, mean_rows, with_mean):
    """embedding_bag over bags of the 4 corner rows (+ the plane-mean row): ``[R*PH*PW, od]``."""
    if with_mean:
        rows = torch.cat((rows, mean_rows[:, None] + n_table), 1)
    return F.embedding_bag(rows, table, mode="sum", per_sample_weights=weights)


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
    acc = compute_dtype(input.dtype)
    hs, he, ws, we, batch = bin_edges(rois, ph_n, pw_n, spatial_scale, h, w, acc)
    rows, area = _corners(hs, he, ws, we, batch, groups, h, w)
    nonempty = area > 0
    inv_area = torch.where(nonempty, 1.0 / area.clamp(min=1).to(acc), 0.0)
    signs = torch.tensor(_SIGNS, dtype=acc, device=input.device)
    weights = torch.cat((inv_area[:, None] * signs, nonempty.to(acc)[:, None]), 1)  # [B, 5]
    mean_rows = (batch.view(r, 1) * groups + torch.arange(groups, device=input.device)).view(-1)

    grouped = _grouped(input, groups)
    table, n_table = _integral_table(grouped, acc, centre=True)
    result = _pool(table, n_table, rows, weights, mean_rows, True)
    if not bool(torch.isfinite(table[n_table:]).all()):  # a non-finite (or overflowing) plane
        result = _nonfinite_forward(grouped, acc, rows, weights, mean_rows)
    output.copy_(result.view(r, ph_n, pw_n, od).permute(0, 3, 1, 2))
    return output, mapping


def _nonfinite_forward(grouped, acc, rows, weights, mean_rows):
    finite_vals = torch.nan_to_num(grouped, nan=0.0, posinf=0.0, neginf=0.0)
    table, n_table = _integral_table(finite_vals, torch.float64, centre=True)
    result = _pool(table, n_table, rows, weights.double(), mean_rows, True)
    counts = []
    presence = (weights[:, :4] != 0).double() * torch.tensor(_SIGNS, dtype=torch.float64, device=rows.device)
    for marker in (torch.isnan(grouped), grouped == float("inf"), grouped == float("-inf")):
        t, nt = _integral_table(marker, torch.float64, centre=False)
        counts.append(_pool(t, nt, rows, presence, mean_rows, False) > 0.5)
    nan_n, pos_n, neg_n = counts
    result = torch.where(pos_n, float("inf"), result)
    result = torch.where(neg_n, float("-inf"), result)
    return torch.where(nan_n | (pos_n & neg_n), float("nan"), result).to(acc)


def _is_canonical(mapping_channel: torch.Tensor) -> bool:
    r, od, ph_n, pw_n = mapping_channel.shape
    chan = torch.arange(od * ph_n * pw_n, device=mapping_channel.device, dtype=mapping_channel.dtype)
    return bool((mapping_channel == chan.view(1, od, ph_n, pw_n)).all())


def _splat(index: torch.Tensor, values: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Difference table ``[n_rows, cols]``: row ``index[b, j]`` receives ``sign_j * values[b]``.

    One ``scatter_add_`` along dim 0 with the row index broadcast over the columns; on CPU each column is
    accumulated by one thread in index order, so the sums are deterministic.
    """
    cols = values.shape[1]
    signs = torch.tensor(_SIGNS, dtype=values.dtype, device=values.device)
    src = (values[None] * signs[:, None, None]).view(-1, cols)  # [4*B, cols], corner-major
    table = torch.zeros((n_rows, cols), dtype=values.dtype, device=values.device)
    return table.scatter_add_(0, index.T.reshape(-1, 1).expand(-1, cols), src)


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
    acc = compute_dtype(top_grad.dtype)
    hs, he, ws, we, batch = bin_edges(rois, ph_n, pw_n, spatial_scale, h, w, acc)
    rows, area = _corners(hs, he, ws, we, batch, groups, h, w)  # [B, 4], [B]
    n_rows = n * groups * (h + 1) * (w + 1)
    inv_area = torch.where(area > 0, 1.0 / area.clamp(min=1).to(acc), 0.0)

    grad = top_grad.permute(0, 2, 3, 1).reshape(-1, od)  # [B, od] in (r, ph, pw) order
    finite = bool(torch.isfinite(grad.sum(dtype=torch.float64)))
    nonempty = (area > 0)[:, None]
    # columns: grad/area | (NaN, +inf, -inf markers if any) | bin coverage (exact zeros elsewhere)
    cols = [(grad.to(acc) if finite else torch.nan_to_num(grad.to(acc), nan=0.0, posinf=0.0, neginf=0.0))
            * inv_area[:, None]]
    if not finite:
        cols += [(m & nonempty).to(acc) for m in (torch.isnan(grad), grad == float("inf"), grad == float("-inf"))]

    if _is_canonical(mapping_channel):  # (r, ph, pw) -> a whole table row, ctop -> its column
        table = _splat(rows, torch.cat(cols + [nonempty.to(acc)], 1), n_rows).view(n, groups, h + 1, w + 1, -1)
        parts = [table[..., i * od:(i + 1) * od] for i in range(len(cols))]
        cover = table[..., -1:]
    else:  # any channel: split it into (ctop, k) and address single elements
        ch = mapping_channel.permute(0, 2, 3, 1).reshape(-1, od).to(torch.int64)  # [B, od]
        ctop, k = ch // groups, ch % groups
        canonical_k = torch.arange(groups, device=rows.device).repeat(r)[:, None]  # [B, 1]
        plane = (h + 1) * (w + 1)
        elem = ((rows[:, None, :] + ((k - canonical_k) * plane)[:, :, None]) * od + ctop[:, :, None])  # [B,od,4]
        per_elem = torch.stack(cols + [nonempty.expand(-1, od).to(acc)], -1).view(-1, len(cols) + 1)
        table = _splat(elem.view(-1, 4), per_elem, n_rows * od).view(n, groups, h + 1, w + 1, od, -1)
        parts = [table[..., i] for i in range(len(cols))]
        cover = table[..., -1]
    torch.cumsum(table, 2, out=table)
    torch.cumsum(table, 3, out=table)
    crop = (slice(None), slice(None), slice(0, h), slice(0, w))
    result = parts[0][crop]
    if not finite:
        nan_n, pos_n, neg_n = (t[crop] > 0.5 for t in parts[1:])
        result = torch.where(pos_n, float("inf"), result)
        result = torch.where(neg_n, float("-inf"), result)
        result = torch.where(nan_n | (pos_n & neg_n), float("nan"), result)
    result = torch.where(cover[crop] > 0.5, result, 0.0)  # [N, K, H, W, od]
    bottom.unflatten(1, (od, groups)).copy_(result.permute(0, 4, 1, 2, 3))
    return bottom
