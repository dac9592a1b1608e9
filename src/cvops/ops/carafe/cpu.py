"""CARAFE on CPU: vectorised torch built from batched matrix products.

The map is cut into tiles of output blocks (one block per input pixel, holding its ``s * s``
sub-pixel outputs), each processed on its own: one worker gathers the tile, computes it and writes its
results into the outputs. A tile of ``ty x tx`` blocks works in a channels-last frame of
``(ty + 2*rh) x (tx + 2*rw)`` pixels: the tile plus the kernel halo, which holds the real neighbouring
pixels inside the map and zeros outside it. Flatten the frame's ``(y, x)`` to a block index ``q``. Tap
``(ky, kx)`` of the block at ``q`` reads pixel ``q + (ky - rh) * Wp + (kx - rw)``, so for one kernel
row ``ky`` the taps of every block form a ``[kw, C]`` matrix that is a plain strided *view* of the
frame (rows ``C`` apart, blocks ``C`` apart). The forward is, per kernel row,

    out[q, phase, :] += mask[q, phase, ky, :] @ x_rows(q, ky)          (one bmm over the tile)

and the backward is the same products transposed: grad_mask per kernel row is
``gy[q] @ x_rows(q, ky)^T``, and grad_input *gathers* (never scatters) from the blocks that read each
pixel, so every result is written once and the bits do not depend on the tiling or the scheduling.
Frame blocks outside the map hold zero masks and gradients, taps outside the map are zeroed in the
mask (the reference skips them: an inf there must not meet the zero padding). Kernel rows/columns that
can never reach the map (``k > 2H - 1``) are cropped, so huge kernels on small maps stay small.
Accumulation is in float32 (float64 for float64 inputs).

Memory: besides its outputs a call allocates one workspace per worker thread, reused by every tile
that thread computes (so the allocator keeps no freed scratch of varying sizes resident). It holds the
tile's frames, sized to about ``_TILE_ELEMS`` accumulator elements (2 MiB of float32) and never less
than one pixel with its halo (``kh * kw`` pixels), then either the NCHW transpose pieces (about
``_GATHER_ELEMS`` elements, at most ``s + 1`` output rows of the tile) or a step's buffers (about
``_CHUNK_ELEMS`` elements, at least one frame row) with the output's transpose pieces. Every term
depends on ``C, G, k, s`` and these constants, never on the map size or the batch: for CARAFE-FPN
(C 256, k 5, G 1, s 2) it is about 3 MB per thread.

NCHW tensors meet the channels-last frames one tile at a time: the tile's slab is gathered,
transposed with torch's blocked 2-D transpose in cache, and results go back the same way. Tiles are
dealt to the cores by run_split's single-threaded workers, not run as threaded torch ops that wait at
a barrier whenever a core is busy (milliseconds each on a shared machine).

With numba installed (and ``CVOPS_NUMBA`` not ``0``) ``cpu_numba`` computes both directions as compiled
loops with the channel loop innermost; this module is the fallback.
"""
from __future__ import annotations

import threading

import torch

from ..._core.jit import numba_kernels
from cvops._core.memory import new_empty
from cvops._core.parallel import run_split

# Frame elements per tile (2 MiB of float32): bounds the frames of each worker thread.
_TILE_ELEMS = 1 << 19
# Elements per step inside a tile (1 MiB of float32): products and transposes stay in cache.
_CHUNK_ELEMS = 1 << 18
# Elements per NCHW slab transposed into a frame at a time.
_GATHER_ELEMS = 1 << 16


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Geometry:
    """Map and kernel geometry shared by every tile: the cropped kernel and its halo."""

    def __init__(self, n, c, h, w, k, g, s):
        self.n, self.c, self.h, self.w, self.k, self.g, self.s = n, c, h, w, k, g, s
        r = (k - 1) // 2
        # taps farther than H-1 rows (W-1 columns) from every pixel never hit the map: crop them
        self.kh, self.kw = min(k, 2 * h - 1), min(k, 2 * w - 1)
        self.rh, self.rw = (self.kh - 1) // 2, (self.kw - 1) // 2
        self.ky0, self.kx0 = r - self.rh, r - self.rw
        self.taps = g * s * s * self.kh * self.kw  # mask elements per block

    def tiles(self, per_pixel: int) -> list[tuple[int, int, int, int, int]]:
        """``(image, y0, y1, x0, x1)`` tiles whose frames hold at most about ``_TILE_ELEMS`` elements
        (``per_pixel`` per frame pixel): bands of whole rows where the halo then costs at most as many
        rows as the band holds (long rows transpose fast), near-square tiles otherwise."""
        rh, rw = self.rh, self.rw
        pixels = max(1, _TILE_ELEMS // max(per_pixel, 1))
        ty = pixels // (self.w + 2 * rw) - 2 * rh
        if ty >= max(1, 2 * rh):
            tx = self.w
        else:
            tx = min(self.w, max(1, int(pixels ** 0.5) - 2 * rw))
            ty = pixels // (tx + 2 * rw) - 2 * rh
        ty = min(self.h, max(1, ty))
        return [(i, y, min(y + ty, self.h), x, min(x + tx, self.w))
                for i in range(self.n) for y in range(0, self.h, ty) for x in range(0, self.w, tx)]

    def zero_outside_taps(self, v: torch.Tensor, ya: int, yb: int, xa: int, xb: int) -> None:
        """Zero the taps of ``v`` (``[yb - ya, xb - xa, G, s*s, kh, kw]``, blocks of map rows
        ``[ya, yb)`` and columns ``[xa, xb)``) that fall outside the map."""
        for ky in range(self.kh):  # the block at map row y reads row y + ky - rh
            top, bottom = min(max(0, self.rh - ky), self.h), max(self.h - max(0, ky - self.rh), 0)
            if top > ya:
                v[:min(top, yb) - ya, :, :, :, ky, :] = 0
            if bottom < yb:
                v[max(bottom, ya) - ya:, :, :, :, ky, :] = 0
        for kx in range(self.kw):
            left, right = min(max(0, self.rw - kx), self.w), max(self.w - max(0, kx - self.rw), 0)
            if left > xa:
                v[:, :min(left, xb) - xa, :, :, :, kx] = 0
            if right < xb:
                v[:, max(right, xa) - xa:, :, :, :, kx] = 0


class _Workspace:
    """One flat scratch buffer per worker thread for the length of a call, carved into each tile's
    frames, step buffers and transpose pieces in turn. Every tile reuses it, so the allocator never
    holds freed scratch beside the live one (freed blocks of varying sizes stay resident in its arenas)."""

    _ALIGN = 64  # bytes: every piece starts cache-line aligned

    def __init__(self, nbytes: int, device):
        self.nbytes, self.device = nbytes, device
        self.buffers: dict[int, torch.Tensor] = {}
        self.local = threading.local()

    def reset(self) -> None:
        """Start a tile on this thread: its buffer is free again."""
        ident = threading.get_ident()
        if ident not in self.buffers:
            self.buffers[ident] = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        self.local.used = 0

    def mark(self) -> int:
        return self.local.used

    def release(self, mark: int) -> None:
        self.local.used = mark

    def take(self, shape, dtype) -> torch.Tensor:
        """Uninitialised ``shape`` tensor from this thread's buffer (a fresh one if it is full)."""
        size = dtype.itemsize
        for d in shape:
            size *= d
        start = self.local.used
        if start + size > self.nbytes:
            return torch.empty(shape, dtype=dtype, device=self.device)
        self.local.used = -(-(start + size) // self._ALIGN) * self._ALIGN
        return self.buffers[threading.get_ident()][start:start + size].view(dtype).view(shape)


def _workspace(geo: _Geometry, tiles, frame_per_pixel: int, step_per_block: int, acc, device) -> _Workspace:
    """Workspace for the largest tile: its frames (``frame_per_pixel`` elements per frame pixel), then
    either the NCHW gather pieces or a step's buffers (``step_per_block`` per block) and store pieces."""
    if not tiles:
        return _Workspace(0, device)
    first, size = _Tile(geo, *tiles[0]), acc.itemsize
    wide = geo.s * first.wp * max(geo.c, geo.g * geo.k * geo.k)  # elements of one output row
    piece = max(_GATHER_ELEMS, wide)  # a transpose piece never holds more than one output row
    gather = (geo.s + 1) * piece
    step = max(first.wp, _CHUNK_ELEMS // max(step_per_block, 1)) * step_per_block + 2 * piece
    return _Workspace(size * (first.q_total * frame_per_pixel + max(gather, step)) + 16 * _Workspace._ALIGN,
                      device)


class _Tile:
    """One tile's frame: ``ty x tx`` blocks at ``(y0, x0)`` of image ``i`` plus the halo."""

    def __init__(self, geo: _Geometry, i, y0, y1, x0, x1, space: _Workspace | None = None):
        self.geo, self.i, self.y0, self.y1, self.x0, self.x1 = geo, i, y0, y1, x0, x1
        self.space = space
        self.ty, self.tx = y1 - y0, x1 - x0
        self.hp, self.wp = self.ty + 2 * geo.rh, self.tx + 2 * geo.rw
        self.q_total = self.hp * self.wp
        # first and one-past-last block of the tile (the interior of the frame)
        self.q0 = geo.rh * self.wp + geo.rw
        self.q1 = (geo.rh + self.ty - 1) * self.wp + geo.rw + self.tx

    def window(self, halo: bool) -> tuple[int, int, int, int]:
        """Map rows ``[ya, yb)`` and columns ``[xa, xb)`` the frame holds (with or without the halo)."""
        geo = self.geo
        if not halo:
            return self.y0, self.y1, self.x0, self.x1
        return (max(0, self.y0 - geo.rh), min(geo.h, self.y1 + geo.rh),
                max(0, self.x0 - geo.rw), min(geo.w, self.x1 + geo.rw))

    def local(self, t: torch.Tensor, ya, yb, xa, xb) -> torch.Tensor:
        """``[yb - ya, xb - xa, ...]`` view of frame tensor ``t`` ``[Q, ...]`` at map rows/columns."""
        v = t.view(self.hp, self.wp, *t.shape[1:])
        oy, ox = self.y0 - self.geo.rh, self.x0 - self.geo.rw
        return v[ya - oy:yb - oy, xa - ox:xb - ox]

    def interior(self, t: torch.Tensor) -> torch.Tensor:
        return self.local(t, self.y0, self.y1, self.x0, self.x1)

    def frame(self, shape, dtype, device, halo: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Frame tensor ``[Q, *shape]``, zero outside the window, and the window's view."""
        t = self.space.take((self.q_total, *shape), dtype)
        win = self.window(halo)
        ya, yb, xa, xb = win
        oy, ox = self.y0 - self.geo.rh, self.x0 - self.geo.rw
        v = t.view(self.hp, self.wp, -1)
        v[:ya - oy] = 0
        v[yb - oy:] = 0
        v[ya - oy:yb - oy, :xa - ox] = 0
        v[ya - oy:yb - oy, xb - ox:] = 0
        return t, self.local(t, *win)

    def tap_rows(self, xflat: torch.Tensor, a: int, b: int, ky: int, g: int) -> torch.Tensor:
        """View ``[b - a, kw, Cg]``: for each block in ``[a, b)``, the taps of kernel row ``ky``, group ``g``."""
        geo = self.geo
        c, cg = geo.c, geo.c // geo.g
        start = (a + (ky - geo.rh) * self.wp - geo.rw) * c + g * cg
        return xflat.as_strided((b - a, geo.kw, cg), (c, c, 1), xflat.storage_offset() + start)

    def steps(self, per_block: int) -> list[tuple[int, int, int, int]]:
        """``(r0, r1, qa, qb)``: spans of the tile's rows ``[r0, r1)`` holding about ``_CHUNK_ELEMS``
        elements (``per_block`` per block) and their blocks ``[qa, qb)`` in the frame."""
        geo, rows = self.geo, max(1, _CHUNK_ELEMS // max(self.wp * per_block, 1))
        return [(r0, min(r0 + rows, self.ty), (geo.rh + r0) * self.wp + geo.rw,
                 (geo.rh + min(r0 + rows, self.ty) - 1) * self.wp + geo.rw + self.tx)
                for r0 in range(0, self.ty, rows)]


def _is_channels_last(t: torch.Tensor) -> bool:
    return t.permute(0, 2, 3, 1).is_contiguous()


def _rows_to_slab(slab: torch.Tensor, rows: torch.Tensor, space: _Workspace) -> None:
    """``slab`` (NCHW ``[C, R, W]`` view) <- contiguous channels-last ``rows`` ``[R * W, C]``.

    torch's blocked 2-D transpose needs a contiguous destination: transpose into a contiguous
    scratch, then copy its channel runs into the slab."""
    flipped = space.take(tuple(slab.shape), rows.dtype)
    flipped.view(slab.shape[0], -1).copy_(rows.t())
    slab.copy_(flipped)


def _gather(t: torch.Tensor, i: int, ya: int, yb: int, xa: int, xb: int, s: int, space: _Workspace, place) -> None:
    """``place(r0, r1, rows)`` for spans of the map rows ``[ya, yb)`` (columns ``[xa, xb)``), ``rows`` the
    span of image ``i`` of logical NCHW ``t`` (``s`` times the map's size) as ``[(r1-r0)*s, (xb-xa)*s, C]``:
    a view for channels-last storage, for NCHW a cache-sized transpose per span (one output row of
    the slab gathered contiguous at a time: torch's blocked transpose is fast only from a contiguous
    source)."""
    if _is_channels_last(t):
        place(0, yb - ya, t[i, :, ya * s:yb * s, xa * s:xb * s].permute(1, 2, 0))
        return
    c, cols = t.shape[1], (xb - xa) * s
    step = max(1, _GATHER_ELEMS // max(s * cols * c, 1))
    mark = space.mark()
    for y in range(ya, yb, step):
        y1 = min(y + step, yb)
        out_rows = (y1 - y) * s
        rows = space.take((out_rows, cols, c), t.dtype)
        # whole spans while one input row fits the piece, else one output row at a time
        per = out_rows if s * cols * c <= _GATHER_ELEMS else 1
        packed = space.take((c, per, cols), t.dtype)
        for r in range(0, out_rows, per):
            packed.copy_(t[i, :, y * s + r:y * s + r + per, xa * s:xb * s])
            rows[r:r + per].view(-1, c).copy_(packed.view(c, -1).t())
        place(y - ya, y1 - ya, rows)
        space.release(mark)


def _frame_input(tile: _Tile, features: torch.Tensor, acc) -> torch.Tensor:
    """Features -> the tile's channels-last frame with its halo, flattened ``[Q * C]``."""
    xp, win = tile.frame((tile.geo.c,), acc, features.device, halo=True)
    _gather(features, tile.i, *tile.window(True), 1, tile.space, lambda r0, r1, rows: win[r0:r1].copy_(rows))
    return xp.view(-1)


def _frame_masks(tile: _Tile, masks: torch.Tensor, acc, halo: bool) -> torch.Tensor:
    """Masks (logical NCHW ``[N, G*k*k, sH, sW]``) -> frame ``[Q, G, s*s, kh, kw]``, zero outside the
    window and at the taps outside the map."""
    geo, s = tile.geo, tile.geo.s
    a, win = tile.frame((geo.g, s * s, geo.kh, geo.kw), acc, masks.device, halo)
    ya, yb, xa, xb = tile.window(halo)
    cols = xb - xa

    def place(r0, r1, rows):
        src = rows.reshape(r1 - r0, s, cols, s, geo.g, geo.k, geo.k)
        src = src[..., geo.ky0:geo.ky0 + geo.kh, geo.kx0:geo.kx0 + geo.kw].permute(0, 2, 4, 1, 3, 5, 6)
        win[r0:r1].view(r1 - r0, cols, geo.g, s, s, geo.kh, geo.kw).copy_(src)

    _gather(masks, tile.i, ya, yb, xa, xb, s, tile.space, place)
    geo.zero_outside_taps(win, ya, yb, xa, xb)
    return a


def _frame_grad_output(tile: _Tile, grad_output: torch.Tensor, acc) -> torch.Tensor:
    """grad_output (logical NCHW ``[N, C, sH, sW]``) -> the tile's frame ``[Q, s*s, C]`` with its halo."""
    geo, s = tile.geo, tile.geo.s
    gb, win = tile.frame((s * s, geo.c), acc, grad_output.device, halo=True)
    ya, yb, xa, xb = tile.window(True)
    cols = xb - xa

    def place(r0, r1, rows):
        src = rows.reshape(r1 - r0, s, cols, s, geo.c).permute(0, 2, 1, 3, 4)
        win[r0:r1].view(r1 - r0, cols, s, s, geo.c).copy_(src)

    _gather(grad_output, tile.i, ya, yb, xa, xb, s, tile.space, place)
    return gb


def _store(tile: _Tile, r0: int, r1: int, out: torch.Tensor, src: torch.Tensor, s: int) -> None:
    """Output ``out`` (logical NCHW ``[N, C', sH, sW]``) at the tile's rows ``[r0, r1)`` <- ``src``
    ``[r1 - r0, s, tx, s, C']``; NCHW a few output rows at a time, transposed in cache."""
    tx, cc = tile.tx, out.shape[1]
    y0 = tile.y0 + r0
    dst = out[tile.i, :, y0 * s:(tile.y0 + r1) * s, tile.x0 * s:tile.x1 * s]
    if _is_channels_last(out):
        dst.permute(1, 2, 0).view(r1 - r0, s, tx, s, cc).copy_(src)
        return
    # a few output rows at a time: whole block rows while one fits the piece, else phase rows
    row = tx * s * cc
    rstep = max(1, _GATHER_ELEMS // max(s * row, 1))
    pstep = s if rstep > 1 or s * row <= _GATHER_ELEMS else max(1, _GATHER_ELEMS // max(row, 1))
    mark = tile.space.mark()
    for r in range(0, r1 - r0, rstep):
        re = min(r + rstep, r1 - r0)
        for py in range(0, s, pstep):
            py1 = min(py + pstep, s)
            staged = tile.space.take((re - r, py1 - py, tx, s, cc), out.dtype)
            staged.copy_(src[r:re, py:py1])
            target = dst[:, r * s:re * s].unflatten(1, (re - r, s))[:, :, py:py1]
            flipped = tile.space.take(tuple(target.shape), out.dtype)
            flipped.view(cc, -1).copy_(staged.view(-1, cc).t())
            target.copy_(flipped)
            tile.space.release(mark)


def _new_output(shape_nchw, dtype, device, layout: str) -> torch.Tensor:
    """Output as a logical NCHW view stored in ``layout``."""
    n, c, h, w = shape_nchw
    if layout == "NHWC":
        return new_empty((n, h, w, c), dtype, device).permute(0, 3, 1, 2)
    return new_empty((n, c, h, w), dtype, device)


def forward(features: torch.Tensor, masks: torch.Tensor, kernel_size: int, group_size: int,
            scale_factor: int, layout: str = "NCHW") -> torch.Tensor:
    """features ``[N, C, H, W]`` and masks ``[N, G*k*k, sH, sW]`` (logical NCHW views) ->
    output ``[N, C, sH, sW]`` (logical NCHW view, stored in ``layout``)."""
    fused = numba_kernels(__package__, features, masks)
    if fused is not None:
        return fused.forward(features, masks, kernel_size, group_size, scale_factor, layout)
    n, c, h, w = features.shape
    geo = _Geometry(n, c, h, w, kernel_size, group_size, scale_factor)
    s, ss, cg, rw = geo.s, geo.s * geo.s, c // geo.g, geo.rw
    acc = _acc_dtype(features.dtype)
    dev = features.device
    out = _new_output((n, c, h * s, w * s), features.dtype, dev, layout)

    tiles = geo.tiles(c + geo.taps)
    space = _workspace(geo, tiles, c + geo.taps, ss * c, acc, dev)

    def body(span):
        space.reset()
        tile = _Tile(geo, *span, space)
        xflat = _frame_input(tile, features, acc)
        a = _frame_masks(tile, masks, acc, halo=False)
        frames = space.mark()
        for r0, r1, qa, qb in tile.steps(ss * c):
            space.release(frames)
            # the products of a few rows go to a cache-sized buffer and straight on to the output,
            # interleaving the phases and (NCHW) transposing while the rows are still in cache
            blocks = space.take(((r1 - r0) * tile.wp, ss, c), acc)  # border columns never stored
            for g in range(geo.g):
                acc_view = blocks[rw:rw + qb - qa, :, g * cg:(g + 1) * cg]
                for ky in range(geo.kh):
                    acc_view.baddbmm_(a[qa:qb, g, :, ky, :], tile.tap_rows(xflat, qa, qb, ky, g),
                                      beta=0 if ky == 0 else 1)
            inner = blocks.view(r1 - r0, tile.wp, s, s, c)[:, rw:rw + tile.tx].permute(0, 2, 1, 3, 4)
            _store(tile, r0, r1, out, inner, s)

    run_split(tiles, body)
    return out


def backward(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor, kernel_size: int,
             group_size: int, scale_factor: int, layout: str = "NCHW"):
    """Returns ``(grad_input [N, C, H, W], grad_mask [N, G*k*k, sH, sW])`` as logical NCHW views
    stored in ``layout``."""
    fused = numba_kernels(__package__, grad_output, features, masks)
    if fused is not None:
        return fused.backward(grad_output, features, masks, kernel_size, group_size, scale_factor, layout)
    n, c, h, w = features.shape
    geo = _Geometry(n, c, h, w, kernel_size, group_size, scale_factor)
    k, kh, kw, rh, rw, s, ss, cg = geo.k, geo.kh, geo.kw, geo.rh, geo.rw, geo.s, geo.s * geo.s, c // geo.g
    acc = _acc_dtype(features.dtype)
    dev = features.device
    gi = _new_output((n, c, h, w), features.dtype, dev, layout)
    gmask = _new_output(tuple(masks.shape), masks.dtype, dev, layout)
    cropped = (kh, kw) != (k, k)

    tiles = geo.tiles(c * (1 + ss) + geo.taps)
    space = _workspace(geo, tiles, c * (1 + ss) + geo.taps, 2 * geo.taps + c, acc, dev)

    def body(span):
        space.reset()
        tile = _Tile(geo, *span, space)
        wp, tx = tile.wp, tile.tx
        xflat = _frame_input(tile, features, acc)
        gb = _frame_grad_output(tile, grad_output, acc)
        gflat = gb.view(-1)
        a = _frame_masks(tile, masks, acc, halo=True)
        sq = a.stride(0)
        frames = space.mark()
        for r0, r1, qa, qb in tile.steps(2 * geo.taps + c):
            space.release(frames)
            rows_here = (r1 - r0) * wp  # buffers of these rows; border columns never stored
            # grad_mask[q, g, phase, ky, kx] = sum_c gy[q, phase, c] * x[q + tap, c]
            gm = space.take((rows_here, geo.g, ss, kh, kw), acc)
            for g in range(geo.g):
                gy = gb[qa:qb, :, g * cg:(g + 1) * cg]
                for ky in range(kh):
                    # a fresh contiguous product then a copy: an in-place product into this strided
                    # view takes torch's slow per-matrix path
                    gm[rw:rw + qb - qa, g, :, ky, :] = torch.bmm(gy, tile.tap_rows(xflat, qa, qb, ky, g).transpose(1, 2))
            inner = gm.view(r1 - r0, wp, geo.g, ss, kh, kw)[:, rw:rw + tx]
            geo.zero_outside_taps(inner, tile.y0 + r0, tile.y0 + r1, tile.x0, tile.x1)
            src = inner.reshape(r1 - r0, tx, geo.g, s, s, kh, kw).permute(0, 3, 1, 4, 2, 5, 6)
            if cropped:  # the taps that never reach the map have zero gradient
                full = torch.zeros((r1 - r0, s, tx, s, geo.g, k, k), dtype=acc, device=dev)
                full[..., geo.ky0:geo.ky0 + kh, geo.kx0:geo.kx0 + kw] = src
                src = full
            _store(tile, r0, r1, gmask, src.reshape(r1 - r0, s, tx, s, geo.g * k * k), s)

            # grad_input[p, c] = sum_{ky, kx, phase} mask[q, phase, ky, kx] * gy[q, phase, c] over the
            # blocks q = p - (ky - rh) * Wp - (kx - rw) that read p. With kx' = kw - 1 - kx, q = base + kx'
            # (base = p - (ky - rh) * Wp - rw), so the (kx', phase) rows of gy are one strided view. The
            # mask is pre-gathered to match: ad[p, g, ky', kx', phase] = a[p - (ky - rh)*Wp - rw + kx', g,
            # phase, ky, kx] with ky' = kh - 1 - ky, which is linear in (p, g, ky', kx', phase): one
            # strided copy.
            diagonal = a.as_strided((qb - qa, geo.g, kh, kw, ss), (sq, a.stride(1), wp * sq - kw, sq - 1, kh * kw),
                                    a.storage_offset() + (qa - tile.q0) * sq + kh * kw - 1)
            ad = space.take((rows_here, geo.g, kh, kw * ss), acc)
            ad.view(rows_here, geo.g, kh, kw, ss)[rw:rw + qb - qa].copy_(diagonal)
            gx = space.take((rows_here, c), acc)
            for g in range(geo.g):
                acc_view = gx[rw:rw + qb - qa, None, g * cg:(g + 1) * cg]
                for ky in range(kh):
                    start = (qa - (ky - rh) * wp - rw) * ss * c + g * cg
                    rows = gflat.as_strided((qb - qa, kw * ss, cg), (ss * c, c, 1), gflat.storage_offset() + start)
                    acc_view.baddbmm_(ad[rw:rw + qb - qa, g, kh - 1 - ky, None, :], rows, beta=0 if ky == 0 else 1)
            _store(tile, r0, r1, gi, gx.view(r1 - r0, wp, c)[:, rw:rw + tx].view(r1 - r0, 1, tx, 1, c), 1)

    run_split(tiles, body)
    return gi, gmask
