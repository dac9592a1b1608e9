"""CARAFE on CPU: vectorised torch built from batched matrix products.

Work happens at input resolution in a zero-padded, channels-last frame ``[N, Hp, Wp, C]``
(``Hp = H + 2r``, ``Wp = W + 2r``, ``r = (k - 1) // 2``). Flatten ``(n, y, x)`` to a pixel index
``q``. A tap ``(ky, kx)`` of the output block at ``q`` reads pixel ``q + (ky - r) * Wp + (kx - r)``,
so for one kernel row ``ky`` the ``k`` taps of every block form a ``[k, C]`` matrix that is a plain
strided *view* of the padded input (rows ``C`` apart, blocks ``C`` apart). Each output block holds
the ``s * s`` sub-pixel phases, so the forward is, per ``ky``,

    out[q, phase, c] += mask[q, phase, ky, :] @ x[q + (ky - r) * Wp - r + kx, c]   (bmm over q)

and the backward is the same products transposed: grad_mask per ``ky`` is ``gy[q] @ x_rows[q]^T``,
and grad_input *gathers* (never scatters) from the blocks that read it, so every result is written
once and the bits do not depend on scheduling. Border blocks of the padded frame hold zero masks
and zero gradients, which makes implicit zero padding exact. Blocks are processed in chunks of a
few image rows so the accumulators stay in cache across the ``k`` products. Accumulation is in
float32 (float64 for float64 inputs).
"""
from __future__ import annotations

import torch

from cvops._core.memory import new_empty, new_zeros

_CHUNK_ELEMS = 1 << 18  # accumulator elements per chunk (1 MiB of float32): stays in L2


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Frame:
    """Geometry of the padded channels-last frame shared by forward and backward."""

    def __init__(self, n, c, h, w, k, g, s):
        self.n, self.c, self.h, self.w, self.k, self.g, self.s = n, c, h, w, k, g, s
        self.r = (k - 1) // 2
        self.hp, self.wp = h + 2 * self.r, w + 2 * self.r
        self.q_total = n * self.hp * self.wp
        # first and one-past-last valid block (interior of the padded frame)
        self.q0 = self.r * self.wp + self.r
        self.q1 = (n - 1) * self.hp * self.wp + (self.r + h - 1) * self.wp + self.r + w

    def chunks(self, per_block: int):
        step = max(self.wp, _CHUNK_ELEMS // max(per_block, 1))
        for a in range(self.q0, self.q1, step):
            yield a, min(a + step, self.q1)

    def interior(self, t: torch.Tensor) -> torch.Tensor:
        """``[N, H, W, ...]`` interior view of a frame tensor ``[Q, ...]``."""
        return t.view(self.n, self.hp, self.wp, *t.shape[1:])[:, self.r:self.r + self.h, self.r:self.r + self.w]


def _pad_input(frame: _Frame, features: torch.Tensor, acc) -> torch.Tensor:
    """Features (logical NCHW) -> zero-padded channels-last frame, flattened ``[Q * C]``."""
    xp = new_zeros((frame.q_total, frame.c), acc, features.device)
    frame.interior(xp).copy_(features.permute(0, 2, 3, 1))
    return xp.view(-1)


def _frame_masks(frame: _Frame, masks: torch.Tensor, acc) -> torch.Tensor:
    """Masks (logical NCHW ``[N, G*k*k, sH, sW]``) -> frame ``[Q, G, s*s, k, k]``, zero borders."""
    f = frame
    a = new_zeros((f.q_total, f.g, f.s * f.s, f.k, f.k), acc, masks.device)
    src = masks.reshape(f.n, f.g, f.k, f.k, f.h, f.s, f.w, f.s).permute(0, 4, 6, 1, 5, 7, 2, 3)
    f.interior(a).view(f.n, f.h, f.w, f.g, f.s, f.s, f.k, f.k).copy_(src)
    _zero_outside_taps(f, a)
    return a


def _zero_outside_taps(frame: _Frame, t: torch.Tensor) -> None:
    """Zero the taps of ``t`` (frame ``[Q, G, s*s, k, k]``) that fall outside the feature map.

    The reference skips such taps, so an inf or NaN mask value there must not meet the zero padding
    (0 * inf = NaN); the same holds for grad_mask, which is exactly 0 at those taps.
    """
    f = frame
    inner = f.interior(t)  # [N, H, W, G, ss, k, k]
    for ky in range(f.k):
        top, bottom = max(0, f.r - ky), max(0, ky - f.r)
        inner[:, :min(top, f.h), :, :, :, ky, :] = 0
        inner[:, max(f.h - bottom, 0):, :, :, :, ky, :] = 0
    for kx in range(f.k):
        left, right = max(0, f.r - kx), max(0, kx - f.r)
        inner[:, :, :min(left, f.w), :, :, :, kx] = 0
        inner[:, :, max(f.w - right, 0):, :, :, :, kx] = 0


def _frame_grad_output(frame: _Frame, grad_output: torch.Tensor, acc) -> torch.Tensor:
    """grad_output (logical NCHW ``[N, C, sH, sW]``) -> frame ``[Q, s*s, C]``, zero borders."""
    f = frame
    gb = new_zeros((f.q_total, f.s * f.s, f.c), acc, grad_output.device)
    src = grad_output.reshape(f.n, f.c, f.h, f.s, f.w, f.s).permute(0, 2, 4, 3, 5, 1)
    f.interior(gb).view(f.n, f.h, f.w, f.s, f.s, f.c).copy_(src)
    return gb


def _tap_rows(frame: _Frame, xflat: torch.Tensor, a: int, b: int, ky: int, g: int) -> torch.Tensor:
    """View ``[b - a, k, Cg]``: for block q, the k taps of kernel row ``ky`` in group ``g``."""
    f = frame
    cg = f.c // f.g
    start = (a + (ky - f.r) * f.wp - f.r) * f.c + g * cg
    return xflat.as_strided((b - a, f.k, cg), (f.c, f.c, 1), xflat.storage_offset() + start)


def _store(frame: _Frame, blocks: torch.Tensor, layout: str, dtype) -> torch.Tensor:
    """Frame ``[Q, s*s, C]`` -> output in ``layout`` (logical NCHW view) of ``dtype``."""
    f = frame
    if layout == "NHWC":
        src = f.interior(blocks).view(f.n, f.h, f.w, f.s, f.s, f.c)
        out = new_empty((f.n, f.h * f.s, f.w * f.s, f.c), dtype, blocks.device)
        out.view(f.n, f.h, f.s, f.w, f.s, f.c).copy_(src.permute(0, 1, 3, 2, 4, 5))
        return out.permute(0, 3, 1, 2)
    # NCHW: a plain 2-D transpose per image (torch's blocked transpose copy), then a copy that
    # only interleaves the sub-pixel phases; one strided 6-D permute copy is several times slower.
    out = new_empty((f.n, f.c, f.h * f.s, f.w * f.s), dtype, blocks.device)
    per_image = blocks.view(f.n, f.hp * f.wp * f.s * f.s, f.c)
    tmp = new_empty((f.c, f.hp * f.wp * f.s * f.s), blocks.dtype, blocks.device)
    for n in range(f.n):
        tmp.copy_(per_image[n].t())
        phases = tmp.view(f.c, f.hp, f.wp, f.s, f.s)[:, f.r:f.r + f.h, f.r:f.r + f.w]
        out[n].view(f.c, f.h, f.s, f.w, f.s).copy_(phases.permute(0, 1, 3, 2, 4))
    return out


def forward(features: torch.Tensor, masks: torch.Tensor, kernel_size: int, group_size: int,
            scale_factor: int, layout: str = "NCHW") -> torch.Tensor:
    """features ``[N, C, H, W]`` and masks ``[N, G*k*k, sH, sW]`` (logical NCHW views) ->
    output ``[N, C, sH, sW]`` (logical NCHW view, stored in ``layout``)."""
    n, c, h, w = features.shape
    f = _Frame(n, c, h, w, kernel_size, group_size, scale_factor)
    acc = _acc_dtype(features.dtype)
    xflat = _pad_input(f, features, acc)
    a = _frame_masks(f, masks, acc)
    ss, cg = f.s * f.s, c // f.g
    blocks = new_empty((f.q_total, ss, c), acc, features.device)
    for qa, qb in f.chunks(ss * c):
        for g in range(f.g):
            acc_view = blocks[qa:qb, :, g * cg:(g + 1) * cg]
            for ky in range(f.k):
                acc_view.baddbmm_(a[qa:qb, g, :, ky, :], _tap_rows(f, xflat, qa, qb, ky, g),
                                  beta=0 if ky == 0 else 1)
    return _store(f, blocks, layout, features.dtype)


def backward(grad_output: torch.Tensor, features: torch.Tensor, masks: torch.Tensor, kernel_size: int,
             group_size: int, scale_factor: int, layout: str = "NCHW"):
    """Returns ``(grad_input [N, C, H, W], grad_mask [N, G*k*k, sH, sW])`` as logical NCHW views
    stored in ``layout``."""
    n, c, h, w = features.shape
    f = _Frame(n, c, h, w, kernel_size, group_size, scale_factor)
    k, r, wp, ss, cg = f.k, f.r, f.wp, f.s * f.s, c // f.g
    acc = _acc_dtype(features.dtype)
    dev = features.device
    xflat = _pad_input(f, features, acc)
    a = _frame_masks(f, masks, acc)
    gb = _frame_grad_output(f, grad_output, acc)
    gflat = gb.view(-1)

    # grad_mask[q, g, phase, ky, kx] = sum_c gy[q, phase, c] * x[q + tap, c]
    gm = new_zeros((f.q_total, f.g, ss, k, k), acc, dev)
    for qa, qb in f.chunks(ss * k * k * f.g + ss * c):
        for g in range(f.g):
            gy = gb[qa:qb, :, g * cg:(g + 1) * cg]
            for ky in range(k):
                gm[qa:qb, g, :, ky, :] = torch.bmm(gy, _tap_rows(f, xflat, qa, qb, ky, g).transpose(1, 2))
    _zero_outside_taps(f, gm)

    # grad_input[p, c] = sum_{ky, kx, phase} mask[q, phase, ky, kx] * gy[q, phase, c],
    # q = p - (ky - r) * Wp - (kx - r). With kx' = k - 1 - kx, q = base + kx' (base = p - (ky-r)*Wp - r),
    # so the (kx', phase) rows of gy are one strided view; the mask is pre-gathered to match.
    ad = new_zeros((f.q_total, f.g, k, k * ss), acc, dev)
    adv = ad.view(f.q_total, f.g, k, k, ss)
    for ky in range(k):
        for kxr in range(k):
            shift = -(ky - r) * wp - r + kxr
            adv[f.q0:f.q1, :, ky, kxr] = a[f.q0 + shift:f.q1 + shift, :, :, ky, k - 1 - kxr]
    gx = new_empty((f.q_total, c), acc, dev)
    for qa, qb in f.chunks(c + k * k * ss * f.g):
        for g in range(f.g):
            acc_view = gx[qa:qb, None, g * cg:(g + 1) * cg]
            for ky in range(k):
                start = ((qa - (ky - r) * wp - r) * ss) * c + g * cg
                rows = gflat.as_strided((qb - qa, k * ss, cg), (ss * c, c, 1), gflat.storage_offset() + start)
                acc_view.baddbmm_(ad[qa:qb, g, ky, None, :], rows, beta=0 if ky == 0 else 1)

    if layout == "NHWC":
        gi = new_empty((n, h, w, c), features.dtype, dev)
        gi.copy_(f.interior(gx))
        gi = gi.permute(0, 3, 1, 2)
    else:
        gi = new_empty((n, c, h, w), features.dtype, dev)
        per_image = gx.view(n, f.hp * f.wp, c)
        tmp = new_empty((c, f.hp * f.wp), acc, dev)
        for i in range(n):
            tmp.copy_(per_image[i].t())
            gi[i].copy_(tmp.view(c, f.hp, f.wp)[:, r:r + h, r:r + w])
    src = f.interior(gm).reshape(n, h, w, f.g, f.s, f.s, k, k)
    if layout == "NHWC":
        gmask = new_empty((n, h * f.s, w * f.s, f.g * k * k), masks.dtype, dev)
        gmask.view(n, h, f.s, w, f.s, f.g, k, k).copy_(src.permute(0, 1, 4, 2, 5, 3, 6, 7))
        gmask = gmask.permute(0, 3, 1, 2)
    else:
        gmask = new_empty((n, f.g * k * k, h * f.s, w * f.s), masks.dtype, dev)
        gmask.view(n, f.g, k, k, h, f.s, w, f.s).copy_(src.permute(0, 3, 6, 7, 1, 4, 2, 5))
    return gi, gmask
