"""psroipool in vectorised torch: summed-area tables, so every bin costs O(1) whatever its size.

Forward. The input is regrouped once as ``[N, K, H+1, W+1, od]`` (K = PH*PW channel groups; input channel
``ctop*K + k``), centred per plane (smaller magnitudes, better fp32 precision) and integrated over H and
W. A bin's ``od`` sums are then four whole rows of that table, ``S[he,we] - S[hs,we] - S[he,ws] +
S[hs,ws]``, so one ``embedding_bag`` (bags of 4 corner rows + the plane-mean row, weights +-1/area and 1)
yields the output directly in ``[R, PH, PW, od]`` order.

Backward (the adjoint). Each top element adds ``grad/area`` at the four corners of a difference table
with one ``scatter_add_`` (each column accumulated by one thread in index order: deterministic); two
cumulative sums turn it into ``bottom_grad``, and a coverage count gives exact zeros where no bin reaches.

Non-finite values would poison every later entry of a summed-area table, so when any is present the
table holds the finite values and count tables of NaN, +inf and -inf decide those bins.

Memory. Each column ``ctop`` of the tables is independent, so both directions build them for a few of the
``od`` columns at a time: a table holds at most ``TABLE_BYTES`` (16 MiB, counted as float64), or one column
(``N*K*(H+1)*(W+1)`` entries, 1/od of the map) where that is larger. Besides the inputs and outputs, a call holds
at most three such tables at once (float64 copies while counting NaN/inf) and per-bin buffers: the forward's corner rows
and weights (``R*K*5`` int64 and accumulation-dtype entries) and its ``[R*K, od]`` accumulation-dtype result,
the backward's ``[R*K, od + 1]`` values (``4*od + 1`` with NaN/inf) and, for a mapping_channel other than the
forward's, four int64 table indices per value.

With numba installed (the ``numba`` extra) and ``CVOPS_NUMBA`` not ``0``, non-empty CPU calls go to the fused
loops of ``cpu_numba`` instead (the network cases are too small for eager torch to reach the IO goal);
this torch code is the fallback and gives the same results within the accumulation tolerance.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._core.jit import numba_kernels
from ..._core.layout import empty_nchw
from . import checks

_SIGNS = (1.0, -1.0, -1.0, 1.0)  # corners (hs,ws), (hs,we), (he,ws), (he,we)
TABLE_BYTES = 16 << 20  # a summed-area or difference table covers as many output_dim columns as fit in this


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Bin-edge arithmetic and accumulation dtype: R-FCN's ``Dtype`` (float32; float64 for float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    t = torch.trunc(v)
    return torch.where((v - t).abs() >= 0.5, t + torch.sign(v), t)


def edge_grid(rois: torch.Tensor, pooled_height: int, pooled_width: int, spatial_scale: float,
              height: int, width: int, dtype: torch.dtype, convention: str = "rfcn"):
    """Bin edges ``[R, 2, P, 2]`` int64 (axis 1: x then y; P = max(PH, PW); last axis: start, end) and the batch
    index [R] (int64), in either convention (see the package docstring): R-FCN clamps to [0, W] / [0, H],
    torchvision to [0, W - 1] / [0, H - 1].

    Arithmetic in ``dtype``, one rounding per operation as in the reference (no fused multiply-add); a NaN edge
    (a scaled corner that overflowed) becomes 0.
    """
    dev = rois.device
    r = rois.to(dtype)
    scale = torch.tensor(spatial_scale, dtype=dtype, device=dev)
    if convention == "torchvision":
        corners = _round_half_away(r[:, 1:5].view(-1, 2, 2) * scale)  # [[x1, y1], [x2, y2]]
        start = corners[:, 0]
        size = torch.clamp_min(corners[:, 1] - start, 1.0)
        shift, offset, drop = torch.zeros_like(start), start, 1
    else:
        corners = _round_half_away(r[:, 1:5].view(-1, 2, 2))
        start = corners[:, 0] * scale
        size = torch.maximum((corners[:, 1] + 1) * scale - start, torch.tensor(0.1, dtype=dtype, device=dev))
        shift, offset, drop = start, torch.zeros_like(start), 0
    bins = size / torch.tensor([pooled_width, pooled_height], dtype=dtype, device=dev)
    p = torch.arange(max(pooled_height, pooled_width) + 1, dtype=dtype, device=dev)
    edges = p * bins[:, :, None] + shift[:, :, None]  # [R, 2, P+1]
    grid = torch.stack((torch.floor(edges[:, :, :-1]), torch.ceil(edges[:, :, 1:])), -1) + offset[:, :, None, None]
    limit = torch.tensor([width - drop, height - drop], dtype=dtype, device=dev).view(1, 2, 1, 1)
    grid = torch.minimum(grid.nan_to_num_(nan=0.0).clamp_(min=0), limit).to(torch.int64)
    return grid, r[:, 0].to(torch.int64)  # C truncation of the batch index (validated beforehand)


def bin_edges(rois, pooled_height, pooled_width, spatial_scale, height, width, dtype, convention="rfcn"):
    """hs, he [R, PH], ws, we [R, PW] (int64) and batch [R]: :func:`edge_grid` split up."""
    grid, batch = edge_grid(rois, pooled_height, pooled_width, spatial_scale, height, width, dtype, convention)
    return (grid[:, 1, :pooled_height, 0], grid[:, 1, :pooled_height, 1],
            grid[:, 0, :pooled_width, 0], grid[:, 0, :pooled_width, 1], batch)


def _corner_rows(grid, batch, ph_n: int, pw_n: int, height: int, width: int, out=None) -> torch.Tensor:
    """Rows ``[R*PH*PW, 4]`` of each bin's corners (hs,ws), (hs,we), (he,ws), (he,we) in the
    ``[N*K*(H+1)*(W+1), od]`` table: ``((b*K + k)*(H+1) + h)*(W+1) + w`` with ``k = ph*PW + pw``.

    Built from the h part ``[R, PH, 2]`` and the w part ``[R, PW, 2]`` with repeats and one contiguous add:
    broadcasting over the short corner axes would cost ~20x more on CPU.
    """
    r = grid.shape[0]
    plane = (height + 1) * (width + 1)
    dev = grid.device
    h_part = grid[:, 1, :ph_n] * (width + 1) + (batch.view(-1, 1, 1) * (ph_n * pw_n * plane)
                                                + (torch.arange(ph_n, device=dev) * (pw_n * plane)).view(1, -1, 1))
    w_part = grid[:, 0, :pw_n] + (torch.arange(pw_n, device=dev) * plane).view(1, -1, 1)
    h4 = h_part.repeat_interleave(2, dim=2).repeat_interleave(pw_n, dim=1)  # [R, PH*PW, 4]: hs hs he he
    w4 = w_part.repeat(1, 1, 2)  # [R, PW, 4]: ws we ws we
    if out is not None:
        return torch.add(h4, w4.repeat(1, ph_n, 1), out=out.view(r, ph_n * pw_n, 4))
    return (h4 + w4.repeat(1, ph_n, 1)).view(r * ph_n * pw_n, 4)


def _areas(grid, ph_n: int, pw_n: int, dtype: torch.dtype) -> torch.Tensor:
    """Bin areas ``[R*PH*PW, 1]`` in ``dtype`` (0 for empty bins)."""
    span = (grid[..., 1] - grid[..., 0]).to(dtype)  # [R, 2, P]: widths, heights
    return (span[:, 1, :ph_n, None] * span[:, 0, None, :pw_n]).view(-1, 1)


def _grouped(t_nchw: torch.Tensor, groups: int) -> torch.Tensor:
    """[N, C, H, W] -> view [N, K, H, W, od] with channel ``ctop*K + k`` (no copy)."""
    c = t_nchw.shape[1]
    return t_nchw.unflatten(1, (c // groups, groups)).permute(0, 2, 3, 4, 1)


def _column_chunks(n_rows: int, od: int, parts: int, extra: int = 0) -> list[tuple[int, int]]:
    """Ranges of the ``od`` columns such that a table of ``n_rows`` rows and ``parts`` float64 columns per channel
    (plus ``extra``) stays within ``TABLE_BYTES``, or holds one channel where a single one is larger."""
    step = max(1, (TABLE_BYTES // (8 * n_rows) - extra) // parts)
    return [(c0, min(c0 + step, od)) for c0 in range(0, od, step)]


def _integral_table(values: torch.Tensor, dtype: torch.dtype, centre: bool):
    """``[N*K*(H+1)*(W+1) + N*K, od]``: the summed-area table of ``values - mean`` (zero border), followed
    by the per-plane means (row ``n_table + b*K + k``). ``values`` is ``[N, K, H, W, od]``."""
    n, k, h, w, od = values.shape
    n_table = n * k * (h + 1) * (w + 1)
    table = torch.empty((n_table + n * k, od), dtype=dtype, device=values.device)
    sat = table[:n_table].view(n, k, h + 1, w + 1, od)
    sat[:, :, 0].zero_()
    sat[:, :, 1:, 0].zero_()
    mean = table[n_table:].view(n, k, 1, 1, od)
    if centre:
        torch.mean(values, dim=(2, 3), keepdim=True, dtype=dtype, out=mean)
        torch.sub(values, mean, out=sat[:, :, 1:, 1:])
    else:
        mean.zero_()
        sat[:, :, 1:, 1:].copy_(values)
    sat.cumsum_(2)
    sat.cumsum_(3)
    return table, n_table


def forward(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
            spatial_scale: float, output_dim: int, out_layout: str = "NCHW", convention: str = "rfcn"):
    """(output, mapping_channel int32) as logical NCHW views of tensors stored in ``out_layout``."""
    fused = (numba_kernels(__package__, input, rois)
             if input.numel() > 0 and rois.shape[0] > 0 else None)
    if fused is not None:
        return fused.forward(input, rois, pooled_height, pooled_width, spatial_scale, output_dim, out_layout,
                             convention)
    n, c, h, w = input.shape
    r = rois.shape[0]
    ph_n, pw_n, od = pooled_height, pooled_width, output_dim
    groups = ph_n * pw_n
    dev = input.device
    mapping = empty_nchw((r, od, ph_n, pw_n), out_layout, like=input.new_empty(0, dtype=torch.int32))
    chan = torch.arange(od * groups, dtype=torch.int32, device=dev).view(1, od, ph_n, pw_n)
    mapping.copy_(chan.expand(r, od, ph_n, pw_n))
    if input.numel() == 0 or r == 0:
        return empty_nchw((r, od, ph_n, pw_n), out_layout, like=input, zero=True), mapping
    acc = compute_dtype(input.dtype)
    grid, batch = edge_grid(rois, ph_n, pw_n, spatial_scale, h, w, acc, convention)
    bins = r * groups

    grouped = _grouped(input, groups)
    n_table = n * groups * (h + 1) * (w + 1)
    # bags: 4 corner rows and the plane-mean row; weights +-1/area and 1 (all 0 for an empty bin)
    rows = torch.empty((bins, 5), dtype=torch.int64, device=dev)
    _corner_rows(grid, batch, ph_n, pw_n, h, w, out=rows[:, :4])
    k = torch.arange(groups, device=dev).view(1, groups)
    torch.add(batch.view(r, 1) * groups + n_table, k, out=rows[:, 4].view(r, groups))
    area = _areas(grid, ph_n, pw_n, acc)
    weights = torch.empty((bins, 5), dtype=acc, device=dev)
    nonempty = torch.gt(area, 0, out=weights[:, 4:])
    inv_area = nonempty / torch.clamp_min(area, 1)
    torch.mul(inv_area, torch.tensor(_SIGNS, dtype=acc, device=dev), out=weights[:, :4])

    result = torch.empty((bins, od), dtype=acc, device=dev)
    for c0, c1 in _column_chunks(n_table + n * groups, od, 1):  # a table of a few channels at a time
        part = grouped[..., c0:c1]
        table, n_table = _integral_table(part, acc, centre=True)
        sums = F.embedding_bag(rows, table, mode="sum", per_sample_weights=weights)  # [R*PH*PW, c1 - c0]
        finite = bool(torch.isfinite(table[n_table:]).all())  # else some plane holds NaN/inf (or overflows)
        del table
        result[:, c0:c1] = sums if finite else _nonfinite_forward(part, acc, rows, weights)
    result = result.view(r, ph_n, pw_n, od)
    if out_layout == "NHWC" and result.dtype == input.dtype:
        return result.permute(0, 3, 1, 2), mapping
    output = empty_nchw((r, od, ph_n, pw_n), out_layout, like=input)
    output.copy_(result.permute(0, 3, 1, 2))
    return output, mapping


def _nonfinite_forward(grouped, acc, rows, weights):
    table, _ = _integral_table(torch.nan_to_num(grouped, nan=0.0, posinf=0.0, neginf=0.0), torch.float64, True)
    result = F.embedding_bag(rows, table, mode="sum", per_sample_weights=weights.double())
    presence = weights.double().sign()
    presence[:, 4] = 0.0
    counts = []
    for marker in (torch.isnan(grouped), grouped == float("inf"), grouped == float("-inf")):
        t, _ = _integral_table(marker, torch.float64, centre=False)
        counts.append(F.embedding_bag(rows, t, mode="sum", per_sample_weights=presence) > 0.5)
    nan_n, pos_n, neg_n = counts
    result = torch.where(pos_n, float("inf"), result)
    result = torch.where(neg_n, float("-inf"), result)
    return torch.where(nan_n | (pos_n & neg_n), float("nan"), result).to(acc)


def _is_canonical(mapping_channel: torch.Tensor) -> bool:
    r, od, ph_n, pw_n = mapping_channel.shape
    chan = torch.arange(od * ph_n * pw_n, device=mapping_channel.device, dtype=mapping_channel.dtype)
    return bool((mapping_channel == chan.view(1, od, ph_n, pw_n)).all())


def _splat(index: torch.Tensor, values: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Difference table ``[n_rows, cols]``: row ``index[b, j]`` receives ``sign_j * values[b]`` (signs
    + - - + for the corners (hs,ws), (hs,we), (he,ws), (he,we)).

    One ``scatter_add_`` per corner along dim 0 with the row index broadcast over the columns (CPU: the
    expanded-index path sorts by row and sums in a fixed order, so the result is deterministic).
    """
    cols = values.shape[1]
    table = torch.zeros((n_rows, cols), dtype=values.dtype, device=values.device)
    negated = -values
    for j, sign in enumerate(_SIGNS):
        table.scatter_add_(0, index[:, j].contiguous().view(-1, 1).expand(-1, cols), values if sign > 0 else negated)
    return table


def backward(top_grad: torch.Tensor, rois: torch.Tensor, mapping_channel: torch.Tensor, spatial_scale: float,
             output_dim: int, input_shape, out_layout: str = "NCHW", trusted_mapping: bool = False,
             convention: str = "rfcn"):
    """bottom_grad (logical NCHW view of a tensor stored in ``out_layout``).

    ``trusted_mapping``: mapping_channel comes from this library's forward (autograd), so its range and
    canonical form need no check.
    """
    fused = (numba_kernels(__package__, top_grad, rois, mapping_channel)
             if top_grad.numel() > 0 and 0 not in input_shape else None)
    if fused is not None:
        return fused.backward(top_grad, rois, mapping_channel, spatial_scale, output_dim, input_shape,
                              out_layout, trusted_mapping, convention)
    n, c, h, w = input_shape
    r, od, ph_n, pw_n = top_grad.shape
    groups = ph_n * pw_n
    bottom = empty_nchw((n, c, h, w), out_layout, like=top_grad)
    if top_grad.numel() == 0 or bottom.numel() == 0:
        return bottom.zero_()
    canonical = trusted_mapping or _is_canonical(mapping_channel)
    if not canonical:  # the forward's mapping is in range by construction
        checks.check_mapping_values(checks.OP_BACKWARD, mapping_channel, c)
    acc = compute_dtype(top_grad.dtype)
    dev = top_grad.device
    grid, batch = edge_grid(rois, ph_n, pw_n, spatial_scale, h, w, acc, convention)
    bins = r * groups
    plane = (h + 1) * (w + 1)
    n_rows = n * groups * plane
    rows = _corner_rows(grid, batch, ph_n, pw_n, h, w)
    area = _areas(grid, ph_n, pw_n, acc)

    grad = top_grad.permute(0, 2, 3, 1).reshape(bins, od)  # (r, ph, pw) rows
    # columns: grad/area | NaN, +inf, -inf markers (only if any) | bin coverage (exact zeros elsewhere)
    finite = bool(torch.isfinite(grad.sum(dtype=acc)))
    width = od + 1 if finite else 4 * od + 1
    values = torch.empty((bins, width), dtype=acc, device=dev)
    nonempty = torch.gt(area, 0, out=values[:, -1:])
    inv_area = nonempty / torch.clamp_min(area, 1)
    if finite:
        torch.mul(grad, inv_area, out=values[:, :od])
    else:
        torch.mul(torch.nan_to_num(grad.to(acc), nan=0.0, posinf=0.0, neginf=0.0), inv_area, out=values[:, :od])
        for i, marker in enumerate((torch.isnan(grad), grad == float("inf"), grad == float("-inf")), 1):
            torch.mul(marker, nonempty, out=values[:, i * od:(i + 1) * od])

    # [N, K, H, W, od] view of bottom (channel ctop*K + k); the tables cover a few of its od columns at a time
    target = bottom.unflatten(1, (od, groups)).permute(0, 2, 3, 4, 1)
    parts = (width - 1) // od
    if not canonical:  # any channel: split it into (ctop, k); a value moves to its k's plane and ctop's column
        ch = mapping_channel.permute(0, 2, 3, 1).reshape(bins, od).to(torch.int64)
        ctop, shift = ch // groups, (ch % groups - torch.arange(groups, device=dev).repeat(r)[:, None]) * plane
    for c0, c1 in _column_chunks(n_rows, od, parts, extra=1):
        cw = c1 - c0
        if canonical:  # (r, ph, pw) -> a whole table row, ctop -> its column
            cols = [values[:, i * od + c0:i * od + c1] for i in range(parts)] + [values[:, -1:]]
            table = _splat(rows, torch.cat(cols, 1), n_rows).view(n, groups, h + 1, w + 1, -1)
            sums = [table[..., i * cw:(i + 1) * cw] for i in range(parts)]
            cover = table[..., -1:]
        else:  # single elements: the (bin, j) whose channel falls in the chunk
            b_i, j_i = ((ctop >= c0) & (ctop < c1)).nonzero().unbind(1)
            elem = (rows[b_i] + shift[b_i, j_i, None]) * cw + (ctop[b_i, j_i] - c0)[:, None]  # [M, 4]
            per_elem = torch.stack([values[b_i, i * od + j_i] for i in range(parts)] + [values[b_i, -1]], 1)
            table = _splat(elem, per_elem, n_rows * cw).view(n, groups, h + 1, w + 1, cw, parts + 1)
            sums = [table[..., i] for i in range(parts)]
            cover = table[..., -1]
        table.cumsum_(2)
        table.cumsum_(3)
        crop = (slice(None), slice(None), slice(0, h), slice(0, w))
        result = sums[0][crop]
        if not finite:
            nan_n, pos_n, neg_n = (t[crop] > 0.5 for t in sums[1:])
            result = torch.where(pos_n, float("inf"), result)
            result = torch.where(neg_n, float("-inf"), result)
            result = torch.where(nan_n | (pos_n & neg_n), float("nan"), result)
        covered = cover[crop] > 0.5  # exact zeros where no bin reaches
        dst = target[..., c0:c1]
        if dst.dtype == acc:
            torch.where(covered, result, torch.zeros((), dtype=acc, device=dev), out=dst)
        else:
            dst.copy_(torch.where(covered, result, 0.0))
        del table, sums, cover, result, covered
    return bottom
