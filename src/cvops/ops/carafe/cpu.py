"""CARAFE on CPU: vectorised torch built from batched matrix products.

Work happens at input resolution in a zero-padded, channels-last frame ``[N, Hp, Wp, C]``
(``Hp = H + 2*rh``, ``Wp = W + 2*rw``). Flatten ``(n, y, x)`` to a block index ``q``. Tap
``(ky, kx)`` of the output block at ``q`` reads pixel ``q + (ky - rh) * Wp + (kx - rw)``, so for one
kernel row ``ky`` the taps of every block form a ``[kw, C]`` matrix that is a plain strided *view*
of the padded input (rows ``C`` apart, blocks ``C`` apart). Each block holds the ``s * s``
sub-pixel phases of the output, so the forward is, per kernel row,

    out[q, phase, :] += mask[q, phase, ky, :] @ x_rows(q, ky)          (one bmm over all q)

and the backward is the same products transposed: grad_mask per kernel row is
``gy[q] @ x_rows(q, ky)^T``, and grad_input *gathers* (never scatters) from the blocks that read each
pixel, so every result is written once and the bits do not depend on scheduling. Border blocks hold
zero masks and gradients, taps outside the map are zeroed in the mask (the reference skips them:
an inf there must not meet the zero padding). Kernel rows/columns that can never reach the map
(``k > 2H - 1``) are cropped, so huge kernels on small maps stay small. Blocks are processed in
chunks of a few image rows so the accumulators stay in cache across the products. Accumulation is
in float32 (float64 for float64 inputs).

NCHW tensors meet the channels-last frame a few rows at a time: each span is gathered, transposed
with torch's blocked 2-D transpose and placed while it is in cache, so no whole-tensor NHWC copy
is made; the forward's products go from a per-span buffer straight to the output. Small fills
and big strided copies run on run_split's single-threaded workers, not as threaded torch ops that
wait at a barrier whenever a core is busy (milliseconds each on a shared machine).

With numba installed (and ``CVOPS_NUMBA`` not ``0``) ``cpu_numba`` computes both directions as compiled
loops with the channel loop innermost; this module is the fallback.
"""
from __future__ import annotations

import torch

from ..._core.jit import numba_kernels
from cvops._core.memory import new_empty, new_zeros
from cvops._core.parallel import run_split, single_threaded
from cvops._core.transpose import to_channels_last

# Accumulator elements per chunk (1 MiB of float32): stays in cache across the k products. Chunks
# are dealt to the cores by run_split (each core runs its products single-threaded: no barriers).
_CHUNK_ELEMS = 1 << 18


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Frame:
    """Geometry of the padded channels-last frame shared by forward and backward."""

    def __init__(self, n, c, h, w, k, g, s):
        self.n, self.c, self.h, self.w, self.k, self.g, self.s = n, c, h, w, k, g, s
        r = (k - 1) // 2
        # taps farther than H-1 rows (W-1 columns) from every pixel never hit the map: crop them
        self.kh, self.kw = min(k, 2 * h - 1), min(k, 2 * w - 1)
        self.rh, self.rw = (self.kh - 1) // 2, (self.kw - 1) // 2
        self.ky0, self.kx0 = r - self.rh, r - self.rw
        self.hp, self.wp = h + 2 * self.rh, w + 2 * self.rw
        self.q_total = n * self.hp * self.wp
        # first and one-past-last valid block (interior of the padded frame)
        self.q0 = self.rh * self.wp + self.rw
        self.q1 = (n - 1) * self.hp * self.wp + (self.rh + h - 1) * self.wp + self.rw + w

    def chunks(self, per_block: int) -> list[tuple[int, int]]:
        step = max(self.wp, _CHUNK_ELEMS // max(per_block, 1))
        return [(a, min(a + step, self.q1)) for a in range(self.q0, self.q1, step)]

    def interior(self, t: torch.Tensor) -> torch.Tensor:
        """``[N, H, W, ...]`` interior view of a frame tensor ``[Q, ...]``."""
        v = t.view(self.n, self.hp, self.wp, *t.shape[1:])
        return v[:, self.rh:self.rh + self.h, self.rw:self.rw + self.w]

    def tap_rows(self, xflat: torch.Tensor, a: int, b: int, ky: int, g: int) -> torch.Tensor:
        """View ``[b - a, kw, Cg]``: for each block in ``[a, b)``, the taps of kernel row ``ky``, group ``g``."""
        cg = self.c // self.g
        start = (a + (ky - self.rh) * self.wp - self.rw) * self.c + g * cg
        return xflat.as_strided((b - a, self.kw, cg), (self.c, self.c, 1), xflat.storage_offset() + start)


def _new_frame(f: _Frame, shape, dtype, device) -> torch.Tensor:
    """Uninitialised frame tensor ``[Q, ...]`` whose border blocks (the padding) are zero."""
    t = new_empty(shape, dtype, device)
    v = t.view(f.n, f.hp, f.wp, -1)
    # small fills: torch's threaded fill would wait at a barrier for a busy core (milliseconds each)
    with single_threaded():
        v[:, :f.rh] = 0
        v[:, f.rh + f.h:] = 0
        v[:, f.rh:f.rh + f.h, :f.rw] = 0
        v[:, f.rh:f.rh + f.h, f.rw + f.w:] = 0
    return t


def _per_image(f: _Frame, body) -> None:
    """``body(n)`` for every image, images dealt to the cores."""
    run_split(list(range(f.n)), body)


def _row_spans(rows: int, row_elems: int) -> list[tuple[int, int]]:
    """Spans of ``rows`` holding about ``_CHUNK_ELEMS`` elements each (``row_elems`` per row)."""
    step = max(1, _CHUNK_ELEMS // max(row_elems, 1))
    return [(y, min(y + step, rows)) for y in range(0, rows, step)]


def _is_channels_last(t: torch.Tensor) -> bool:
    return t.permute(0, 2, 3, 1).is_contiguous()


def _slab_to_rows(slab: torch.Tensor) -> torch.Tensor:
    """NCHW slab ``[C, R, W]`` -> contiguous channels-last ``[R * W, C]`` (a cache-sized transpose)."""
    c = slab.shape[0]
    # gather the slab first: torch's blocked transpose is fast only from a contiguous source
    packed = slab.contiguous().view(c, -1)
    rows = torch.empty((packed.shape[1], c), dtype=slab.dtype, device=slab.device)
    rows.copy_(packed.t())
    return rows


def _rows_to_slab(slab: torch.Tensor, rows: torch.Tensor) -> None:
    """``slab`` (NCHW ``[C, R, W]`` view) <- contiguous channels-last ``rows`` ``[R * W, C]``.

    torch's blocked 2-D transpose needs a contiguous destination: transpose into a contiguous
    scratch, then copy its channel runs into the slab."""
    flipped = torch.empty(tuple(slab.shape), dtype=rows.dtype, device=rows.device)
    flipped.view(slab.shape[0], -1).copy_(rows.t())
    slab.copy_(flipped)


def _pad_input(f: _Frame, features: torch.Tensor, acc) -> torch.Tensor:
    """Features (logical NCHW) -> zero-padded channels-last frame, flattened ``[Q * C]``."""
    xp = _new_frame(f, (f.q_total, f.c), acc, features.device)
    inner = f.interior(xp)
    if _is_channels_last(features):
        _per_image(f, lambda n: inner[n].copy_(features[n].permute(1, 2, 0)))
    else:  # NCHW: transpose a few rows at a time, in cache, straight into the frame
        spans = _row_spans(f.h, f.w * f.c)
        _per_image(f, lambda n: [inner[n, y0:y1].copy_(_slab_to_rows(features[n, :, y0:y1]).view(y1 - y0, f.w, f.c))
                                 for y0, y1 in spans])
    return xp.view(-1)


def _frame_masks(f: _Frame, masks: torch.Tensor, acc) -> torch.Tensor:
    """Masks (logical NCHW ``[N, G*k*k, sH, sW]``) -> frame ``[Q, G, s*s, kh, kw]``, zero borders."""
    a = _new_frame(f, (f.q_total, f.g, f.s * f.s, f.kh, f.kw), acc, masks.device)
    inner = f.interior(a).view(f.n, f.h, f.w, f.g, f.s, f.s, f.kh, f.kw)

    def fill(n):
        src = to_channels_last(masks[n:n + 1]).view(1, f.h, f.s, f.w, f.s, f.g, f.k, f.k)
        src = src[..., f.ky0:f.ky0 + f.kh, f.kx0:f.kx0 + f.kw].permute(0, 1, 3, 5, 2, 4, 6, 7)
        inner[n:n + 1].copy_(src)

    _per_image(f, fill)
    _zero_outside_taps(f, a)
    return a


def _zero_outside_taps(f: _Frame, t: torch.Tensor) -> None:
    """Zero the taps of ``t`` (frame ``[Q, G, s*s, kh, kw]``) that fall outside the feature map."""
    inner = f.interior(t)  # [N, H, W, G, ss, kh, kw]
    for ky in range(f.kh):
        top, bottom = max(0, f.rh - ky), max(0, ky - f.rh)
        if top:
            inner[:, :min(top, f.h), :, :, :, ky, :] = 0
        if bottom:
            inner[:, max(f.h - bottom, 0):, :, :, :, ky, :] = 0
    for kx in range(f.kw):
        left, right = max(0, f.rw - kx), max(0, kx - f.rw)
        if left:
            inner[:, :, :min(left, f.w), :, :, :, kx] = 0
        if right:
            inner[:, :, max(f.w - right, 0):, :, :, :, kx] = 0


def _frame_grad_output(f: _Frame, grad_output: torch.Tensor, acc) -> torch.Tensor:
    """grad_output (logical NCHW ``[N, C, sH, sW]``) -> frame ``[Q, s*s, C]``, zero borders."""
    gb = _new_frame(f, (f.q_total, f.s * f.s, f.c), acc, grad_output.device)
    inner = f.interior(gb).view(f.n, f.h, f.w, f.s, f.s, f.c)

    s = f.s

    def fill(n):
        if _is_channels_last(grad_output):
            src = grad_output[n].permute(1, 2, 0).view(f.h, s, f.w, s, f.c).permute(0, 2, 1, 3, 4)
            inner[n].copy_(src)
            return
        for y0, y1 in _row_spans(f.h, s * s * f.w * f.c):  # NCHW: transpose a few rows at a time, in cache
            rows = _slab_to_rows(grad_output[n, :, y0 * s:y1 * s])
            inner[n, y0:y1].copy_(rows.view(y1 - y0, s, f.w, s, f.c).permute(0, 2, 1, 3, 4))

    _per_image(f, fill)
    return gb


def _row_chunks(f: _Frame, per_block: int) -> list[tuple[int, int, int]]:
    """``(image, first_row, end_row)`` spans of whole image rows, about ``_CHUNK_ELEMS`` per span."""
    rows = max(1, _CHUNK_ELEMS // max(f.wp * per_block, 1))
    return [(i, y, min(y + rows, f.h)) for i in range(f.n) for y in range(0, f.h, rows)]


def forward(features: torch.Tensor, masks: torch.Tensor, kernel_size: int, group_size: int,
            scale_factor: int, layout: str = "NCHW") -> torch.Tensor:
    """features ``[N, C, H, W]`` and masks ``[N, G*k*k, sH, sW]`` (logical NCHW views) ->
    output ``[N, C, sH, sW]`` (logical NCHW view, stored in ``layout``)."""
    fused = numba_kernels(__package__, features, masks)
    if fused is not None:
        return fused.forward(features, masks, kernel_size, group_size, scale_factor, layout)
    n, c, h, w = features.shape
    f = _Frame(n, c, h, w, kernel_size, group_size, scale_factor)
    s, ss, cg = f.s, f.s * f.s, c // f.g
    acc = _acc_dtype(features.dtype)
    xflat = _pad_input(f, features, acc)
    a = _frame_masks(f, masks, acc)
    dtype, dev = features.dtype, features.device
    if layout == "NHWC":
        out_nhwc = new_empty((n, h * s, w * s, c), dtype, dev)
    else:
        out = new_empty((n, c, h * s, w * s), dtype, dev)

    def chunk(span):
        # the products of a few image rows go to a cache-sized buffer and straight on to the output,
        # interleaving the phases and (NCHW) transposing while the rows are still in cache
        i, y0, y1 = span
        row0 = (i * f.hp + f.rh + y0) * f.wp
        qa, qb = row0 + f.rw, row0 + (y1 - y0 - 1) * f.wp + f.rw + w  # first .. last interior block
        blocks = torch.empty(((y1 - y0) * f.wp, ss, c), dtype=acc, device=dev)  # border columns never stored
        for g in range(f.g):
            acc_view = blocks[f.rw:f.rw + qb - qa, :, g * cg:(g + 1) * cg]
            for ky in range(f.kh):
                acc_view.baddbmm_(a[qa:qb, g, :, ky, :], f.tap_rows(xflat, qa, qb, ky, g), beta=0 if ky == 0 else 1)
        rows = (y1 - y0) * s
        inner = blocks.view(y1 - y0, f.wp, s, s, c)[:, f.rw:f.rw + w].permute(0, 2, 1, 3, 4)
        if layout == "NHWC":
            out_nhwc[i, y0 * s:y1 * s].view(y1 - y0, s, w, s, c).copy_(inner)
            return
        tile = torch.empty((y1 - y0, s, w, s, c), dtype=dtype, device=dev)
        tile.copy_(inner)
        _rows_to_slab(out[i, :, y0 * s:y1 * s], tile.view(rows * w * s, c))

    run_split(_row_chunks(f, ss * c), chunk)
    return out_nhwc.permute(0, 3, 1, 2) if layout == "NHWC" else out


def backward(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor, kernel_size: int,
             group_size: int, scale_factor: int, layout: str = "NCHW"):
    """Returns ``(grad_input [N, C, H, W], grad_mask [N, G*k*k, sH, sW])`` as logical NCHW views
    stored in ``layout``."""
    fused = numba_kernels(__package__, grad_output, features, masks)
    if fused is not None:
        return fused.backward(grad_output, features, masks, kernel_size, group_size, scale_factor, layout)
    n, c, h, w = features.shape
    f = _Frame(n, c, h, w, kernel_size, group_size, scale_factor)
    k, kh, kw, rh, rw, wp, ss, cg = f.k, f.kh, f.kw, f.rh, f.rw, f.wp, f.s * f.s, c // f.g
    acc = _acc_dtype(features.dtype)
    dev = features.device
    xflat = _pad_input(f, features, acc)
    a = _frame_masks(f, masks, acc)
    gb = _frame_grad_output(f, grad_output, acc)
    gflat = gb.view(-1)

    # grad_mask[q, g, phase, ky, kx] = sum_c gy[q, phase, c] * x[q + tap, c]
    gm = new_empty((f.q_total, f.g, ss, kh, kw), acc, dev)  # only the interior is computed and read
    def mask_chunk(bounds):
        qa, qb = bounds
        for g in range(f.g):
            gy = gb[qa:qb, :, g * cg:(g + 1) * cg]
            for ky in range(kh):
                # a fresh contiguous product then a copy: an in-place product into this strided
                # view takes torch's slow per-matrix path
                gm[qa:qb, g, :, ky, :] = torch.bmm(gy, f.tap_rows(xflat, qa, qb, ky, g).transpose(1, 2))

    run_split(f.chunks(ss * kh * kw * f.g + ss * c), mask_chunk)
    _zero_outside_taps(f, gm)

    # grad_input[p, c] = sum_{ky, kx, phase} mask[q, phase, ky, kx] * gy[q, phase, c] over the blocks
    # q = p - (ky - rh) * Wp - (kx - rw) that read p. With kx' = kw - 1 - kx, q = base + kx'
    # (base = p - (ky - rh) * Wp - rw), so the (kx', phase) rows of gy are one strided view. The mask is
    # pre-gathered to match: ad[p, g, ky', kx', phase] = a[p - (ky - rh)*Wp - rw + kx', g, phase, ky, kx]
    # with ky' = kh - 1 - ky, which is linear in (p, g, ky', kx', phase): one strided copy.
    sq = a.stride(0)
    diagonal = a.as_strided((f.q1 - f.q0, f.g, kh, kw, ss), (sq, a.stride(1), wp * sq - kw, sq - 1, kh * kw),
                            a.storage_offset() + kh * kw - 1)
    ad = new_empty((f.q_total, f.g, kh, kw * ss), acc, dev)  # rows [q0, q1) are all the products read
    ad_rows = ad.view(f.q_total, f.g, kh, kw, ss)[f.q0:f.q1]
    run_split([(a0 - f.q0, b0 - f.q0) for a0, b0 in f.chunks(f.g * kh * kw * ss)],
              lambda span: ad_rows[span[0]:span[1]].copy_(diagonal[span[0]:span[1]]))
    gx = new_empty((f.q_total, c), acc, dev)
    def input_chunk(bounds):
        qa, qb = bounds
        for g in range(f.g):
            acc_view = gx[qa:qb, None, g * cg:(g + 1) * cg]
            for ky in range(kh):
                start = (qa - (ky - rh) * wp - rw) * ss * c + g * cg
                rows = gflat.as_strided((qb - qa, kw * ss, cg), (ss * c, c, 1), gflat.storage_offset() + start)
                acc_view.baddbmm_(ad[qa:qb, g, kh - 1 - ky, None, :], rows, beta=0 if ky == 0 else 1)

    run_split(f.chunks(c + kh * kw * ss * f.g), input_chunk)

    gx_inner = f.interior(gx)
    src = f.interior(gm).reshape(n, h, w, f.g, f.s, f.s, kh, kw).permute(0, 1, 4, 2, 5, 3, 6, 7)
    cropped = (kh, kw) != (k, k)
    gk = f.g * k * k
    if layout == "NHWC":
        gi = new_empty((n, h, w, c), features.dtype, dev)
        gmask = (new_zeros if cropped else new_empty)((n, h * f.s, w * f.s, gk), masks.dtype, dev)
        gm_dst = gmask.view(n, h, f.s, w, f.s, f.g, k, k)[..., f.ky0:f.ky0 + kh, f.kx0:f.kx0 + kw]

        def store(i):
            gi[i].copy_(gx_inner[i])
            gm_dst[i].copy_(src[i])

        _per_image(f, store)
        return gi.permute(0, 3, 1, 2), gmask.permute(0, 3, 1, 2)

    # NCHW: gather a few rows channels-last in cache, then transpose them into place
    gi = new_empty((n, c, h, w), features.dtype, dev)
    gmask = new_empty(tuple(masks.shape), masks.dtype, dev)

    def store_nchw(i):
        for y0, y1 in _row_spans(h, w * c):
            tile = torch.empty((y1 - y0, w, c), dtype=features.dtype, device=dev)
            tile.copy_(gx_inner[i, y0:y1])
            _rows_to_slab(gi[i, :, y0:y1], tile.view(-1, c))
        for y0, y1 in _row_spans(h, f.s * f.s * w * gk):
            tile = (torch.zeros if cropped else torch.empty)((y1 - y0, f.s, w, f.s, gk), dtype=masks.dtype, device=dev)
            tile.view(y1 - y0, f.s, w, f.s, f.g, k, k)[..., f.ky0:f.ky0 + kh, f.kx0:f.kx0 + kw].copy_(src[i, y0:y1])
            _rows_to_slab(gmask[i, :, y0 * f.s:y1 * f.s], tile.view(-1, gk))

    _per_image(f, store_nchw)
    return gi, gmask
