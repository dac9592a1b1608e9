"""psroipool in plain torch (the ``torch`` backend): the pixels of every bin as rows of index tensors.

The input is viewed as a table ``[N*H*W*K, od]`` (K = PH*PW channel groups: row ``(pixel, k)`` holds the od
channels ``ctop*K + k`` of that pixel), copied a few columns at a time. A bin of group ``k = ph*PW + pw`` is a
bag of its pixels' rows in row-major order, so one ``embedding_bag`` (mode ``"sum"``) gives every bin's sums in
the reference's order; they are divided by the bin's area (empty bins give 0). The backward is the adjoint:
``index_add_`` of each bin's ``top_grad / area`` row into its pixels' rows (serial on the CPU: deterministic),
or, for another mapping_channel than the forward's, of single elements into a few input channels at a time.

Memory: a column chunk of the table holds at most ``TABLE_BYTES`` (at least one column), and the index tensors
of a chunk of bins as much (at least one bin); besides, per-bin tensors of the output's size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._core.layout import empty_nchw
from . import checks

TABLE_BYTES = 16 << 20  # a column chunk of the table, and the index tensors of a chunk of bins
_INDEX_BYTES = 48  # index tensors per pixel of a chunk: bin, row, offsets on the way


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Bin-edge arithmetic and accumulation dtype: R-FCN's ``Dtype`` (float32; float64 for float64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    t = torch.trunc(v)
    return torch.where((v - t).abs() >= 0.5, t + torch.sign(v), t)


def bin_edges(rois, pooled_height, pooled_width, spatial_scale, height, width, dtype, convention="rfcn"):
    """hs, he [R, PH], ws, we [R, PW] (int64) and the batch index [R], in either convention (see the package
    docstring): R-FCN clamps to [0, H] / [0, W], torchvision to [0, H - 1] / [0, W - 1].

    Arithmetic in ``dtype``, one rounding per operation as in the reference (no fused multiply-add); a NaN edge
    (a scaled corner that overflowed) becomes 0."""
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
    edges = p * bins[:, :, None] + shift[:, :, None]  # [R, 2 (x, y), P+1]
    grid = torch.stack((torch.floor(edges[:, :, :-1]), torch.ceil(edges[:, :, 1:])), -1) + offset[:, :, None, None]
    limit = torch.tensor([width - drop, height - drop], dtype=dtype, device=dev).view(1, 2, 1, 1)
    grid = torch.minimum(grid.nan_to_num_(nan=0.0).clamp_(min=0), limit).to(torch.int64)
    return (grid[:, 1, :pooled_height, 0], grid[:, 1, :pooled_height, 1],
            grid[:, 0, :pooled_width, 0], grid[:, 0, :pooled_width, 1],
            r[:, 0].to(torch.int64))  # C truncation of the batch index (validated beforehand)


def _bins(rois, ph_n, pw_n, spatial_scale, height, width, dtype, convention):
    """Per bin (RoI, ph, pw), in that order: its first pixel in the [N, H, W] grid, its rows and its columns."""
    hs, he, ws, we, batch = bin_edges(rois, ph_n, pw_n, spatial_scale, height, width, dtype, convention)
    shape = (rois.shape[0], ph_n, pw_n)
    first = (batch[:, None, None] * height + hs[:, :, None]) * width + ws[:, None, :]
    return (first.reshape(-1), (he - hs).clamp_min(0)[:, :, None].expand(shape).reshape(-1),
            (we - ws).clamp_min(0)[:, None, :].expand(shape).reshape(-1))


def _ragged(counts: torch.Tensor):
    """(owner, rank) of each of the ``sum(counts)`` items that ``counts`` hands out in order: the index of the
    count it belongs to and its place there. A cumulative sum of marks rather than ``repeat_interleave``, which
    forks threads even for a few items."""
    starts = counts.cumsum(0) - counts
    total = int(counts.sum())
    marks = torch.zeros(total + 1, dtype=torch.int64, device=counts.device)
    owner = marks.index_add_(0, starts, torch.ones_like(starts))[:total].cumsum(0) - 1
    return owner, torch.arange(total, device=counts.device) - starts[owner]


def _pixels(base, rows, cols, row_step, col_step, row_bytes):
    """(first bin, last bin + 1, bin, index) of every pixel of the bins whose first pixel is at index ``base``
    (each bin's pixels in row-major order, the bins in their order), in chunks of whole bins whose index tensors
    and ``row_bytes`` per pixel stay within ``TABLE_BYTES`` (at least one bin)."""
    ends = (rows * cols).cumsum(0)
    step = max(1, TABLE_BYTES // (_INDEX_BYTES + row_bytes))
    start = 0
    while start < len(base):
        before = int(ends[start]) - int(rows[start] * cols[start])  # pixels of the bins ahead of this chunk
        stop = max(start + 1, int(torch.searchsorted(ends, before + step, right=True)))
        row_bin, y = _ragged(rows[start:stop])
        width = cols[start:stop][row_bin]
        pixel_row, x = _ragged(width)
        pixel_bin = row_bin[pixel_row]
        yield start, stop, pixel_bin + start, base[start:stop][pixel_bin] + y[pixel_row] * row_step + x * col_step
        start = stop


def _column_chunks(rows: int, columns: int, dtype: torch.dtype):
    """Column ranges of a ``[rows, columns]`` table of ``dtype`` within ``TABLE_BYTES`` (at least one column)."""
    step = max(1, TABLE_BYTES // (rows * torch.empty(0, dtype=dtype).element_size()))
    return [(c0, min(c0 + step, columns)) for c0 in range(0, columns, step)]


def _grouped(t_nchw: torch.Tensor, groups: int) -> torch.Tensor:
    """[N, C, H, W] -> view [N, H, W, K, od] with channel ``ctop*K + k`` (no copy)."""
    return t_nchw.unflatten(1, (t_nchw.shape[1] // groups, groups)).permute(0, 3, 4, 2, 1)


def forward(input: torch.Tensor, rois: torch.Tensor, pooled_height: int, pooled_width: int,
            spatial_scale: float, output_dim: int, out_layout: str = "NCHW", convention: str = "rfcn"):
    """(output, mapping_channel int32) as logical NCHW views of tensors stored in ``out_layout``."""
    n, c, h, w = input.shape
    shape = (rois.shape[0], output_dim, pooled_height, pooled_width)
    mapping = empty_nchw(shape, out_layout, like=input.new_empty(0, dtype=torch.int32))
    mapping.copy_(torch.arange(c, dtype=torch.int32, device=input.device).view(1, *shape[1:]).expand(shape))
    output = empty_nchw(shape, out_layout, like=input, zero=True)
    if input.numel() == 0 or rois.shape[0] == 0:
        return output, mapping
    acc = compute_dtype(input.dtype)
    r, groups, od = rois.shape[0], pooled_height * pooled_width, output_dim
    first, rows, cols = _bins(rois, pooled_height, pooled_width, spatial_scale, h, w, acc, convention)
    base = first * groups + torch.arange(groups, device=input.device).repeat(r)  # table row of each bin's first pixel
    area = rows * cols
    grouped = _grouped(input.detach(), groups)
    sums = torch.empty((r * groups, od), dtype=acc, device=input.device)
    for c0, c1 in _column_chunks(n * h * w * groups, od, acc):
        table = torch.empty((n, h, w, groups, c1 - c0), dtype=acc, device=input.device)
        table.copy_(grouped[..., c0:c1])
        for start, stop, _, index in _pixels(base, rows, cols, w * groups, groups, 0):
            offsets = area[start:stop].cumsum(0) - area[start:stop]
            sums[start:stop, c0:c1] = F.embedding_bag(index, table.view(-1, c1 - c0), offsets, mode="sum")
    area = area.to(acc)[:, None]
    means = torch.where(area > 0, sums / area.clamp_min(1), 0.0)
    output.copy_(means.view(r, pooled_height, pooled_width, od).permute(0, 3, 1, 2))
    return output, mapping


def _is_canonical(mapping_channel: torch.Tensor) -> torch.Tensor:
    """Whether ``mapping_channel`` is the forward's (channel ``(ctop*PH + ph)*PW + pw`` in every RoI), as a bool
    tensor on its device (Triton's check needs no host sync)."""
    r, od, ph_n, pw_n = mapping_channel.shape
    chan = torch.arange(od * ph_n * pw_n, device=mapping_channel.device, dtype=mapping_channel.dtype)
    return (mapping_channel == chan.view(1, od, ph_n, pw_n)).all()


def backward(top_grad: torch.Tensor, rois: torch.Tensor, mapping_channel: torch.Tensor, spatial_scale: float,
             output_dim: int, input_shape, out_layout: str = "NCHW", trusted_mapping: bool = False,
             convention: str = "rfcn"):
    """bottom_grad (logical NCHW view of a tensor stored in ``out_layout``).

    ``trusted_mapping``: mapping_channel comes from this library's forward (autograd), so its range needs no
    check."""
    n, c, h, w = input_shape
    _, od, ph_n, pw_n = top_grad.shape
    bottom = empty_nchw((n, c, h, w), out_layout, like=top_grad, zero=True)
    if top_grad.numel() == 0 or bottom.numel() == 0:
        return bottom
    if not trusted_mapping:
        checks.check_mapping_values(checks.OP_BACKWARD, mapping_channel, c)
    acc = compute_dtype(top_grad.dtype)
    r, groups = top_grad.shape[0], ph_n * pw_n
    first, rows, cols = _bins(rois, ph_n, pw_n, spatial_scale, h, w, acc, convention)
    area = rows * cols
    values = top_grad.detach().permute(0, 2, 3, 1).reshape(r * groups, od).to(acc) / area.to(acc)[:, None]
    if trusted_mapping or _is_canonical(mapping_channel):  # rows of od values into the table [N*H*W*K, od]
        base = first * groups + torch.arange(groups, device=top_grad.device).repeat(r)
        target = _grouped(bottom, groups)
        for c0, c1 in _column_chunks(n * h * w * groups, od, acc):
            table = torch.zeros((n * h * w * groups, c1 - c0), dtype=acc, device=top_grad.device)
            row_bytes = (c1 - c0) * table.element_size()
            for _, _, bins, index in _pixels(base, rows, cols, w * groups, groups, row_bytes):
                table.index_add_(0, index, values[bins, c0:c1])
            target[..., c0:c1].copy_(table.view(n, h, w, groups, c1 - c0))
        return bottom
    # any channel: single values into a buffer [N, c1 - c0, H, W] of a few input channels at a time
    channel = mapping_channel.permute(0, 2, 3, 1).reshape(-1).to(torch.int64)  # (bin, ctop) order
    values = values.reshape(-1)
    area, first, rows, cols = (t[:, None].expand(-1, od).reshape(-1) for t in (area, first, rows, cols))
    batch, pixel = torch.div(first, h * w, rounding_mode="floor"), torch.remainder(first, h * w)
    for c0, c1 in _column_chunks(n * h * w, c, acc):
        picked = ((channel >= c0) & (channel < c1) & (area > 0)).nonzero().view(-1)
        buf = torch.zeros(n * (c1 - c0) * h * w, dtype=acc, device=top_grad.device)
        base = (batch[picked] * (c1 - c0) + channel[picked] - c0) * (h * w) + pixel[picked]
        for _, _, bins, index in _pixels(base, rows[picked], cols[picked], w, 1, 0):
            buf.index_add_(0, index, values[picked[bins]])
        bottom[:, c0:c1].copy_(buf.view(n, c1 - c0, h, w))
    return bottom
