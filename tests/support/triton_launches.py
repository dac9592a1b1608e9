"""A representative set of Triton launches: every op's triton backend, forward and backward, on tiny inputs.

It covers what changes a kernel's compiled code: every element dtype the op accepts, both layouts, every
mode constexpr (psamask collect/distribute, sparse subm/regular/transpose, masked accumulate or not) and
the integer specialisations of a contiguous launch. Shapes do not change the code except through those
specialisations, so tiny shapes are enough; ``tools/gpu_report.py --tests`` records the test suite's
launches instead. Run under ``TRITON_INTERPRET=1`` with a :class:`~tests.support.triton_specs.Recorder`.
"""
from __future__ import annotations

import contextlib

import torch

import cvops
from cvops._core.indexing import forced_int64
from cvops.sparse.functional import indice_conv

DATA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ACC_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _nhwc(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.permute(0, 2, 3, 1).contiguous() if layout == "NHWC" else t


def psamask_launches(dtypes=DATA_DTYPES) -> None:
    x = torch.randn(2, 9, 5, 6)
    for dtype in dtypes:
        for layout in ("NCHW", "NHWC"):
            for mode in ("collect", "distribute"):
                xi = _nhwc(x.to(dtype), layout)
                y = cvops.psamask_forward(xi, mode, (3, 3), layout, backend="triton")
                cvops.psamask_backward(y, mode, (3, 3), layout, backend="triton")


def carafe_launches(dtypes=ACC_DTYPES) -> None:
    n, c, h, w, k, g, s = 1, 8, 3, 4, 3, 2, 2
    x = torch.randn(n, c, h, w)
    m = torch.randn(n, g * k * k, h * s, w * s).softmax(1)
    gy = torch.randn(n, c, h * s, w * s)
    for dtype in dtypes:
        for layout in ("NCHW", "NHWC"):
            xi, mi, gi = (_nhwc(t.to(dtype), layout) for t in (x, m, gy))
            cvops.carafe_forward(xi, mi, k, g, s, layout, backend="triton")
            cvops.carafe_backward(gi, xi, mi, k, g, s, layout, backend="triton")
    # the network configuration (k = 5: the radius is not the specialised constant 1)
    x5, m5 = torch.randn(1, 4, 3, 3, dtype=dtypes[0]), torch.randn(1, 25, 6, 6, dtype=dtypes[0])
    cvops.carafe_backward(cvops.carafe_forward(x5, m5, 5, 1, 2, backend="triton"), x5, m5, 5, 1, 2, backend="triton")


def masked_im2col_launches(dtypes=ACC_DTYPES) -> None:
    feature = torch.randn(1, 4, 6, 7)
    mask = torch.rand(1, 6, 7) > 0.5
    weight = torch.randn(3, 4, 3, 3)
    for dtype in dtypes:
        f = feature.to(dtype).requires_grad_()
        out = cvops.masked_conv2d(f, mask, weight.to(dtype), padding=1, backend="triton")
        out.sum().backward()
        h, w = torch.nonzero(mask[0], as_tuple=True)
        cvops.masked_im2col(f.detach(), h.to(torch.int32), w.to(torch.int32), 3, 1, backend="triton")
        col = torch.randn(4, h.numel(), dtype=dtype, requires_grad=True)
        cvops.masked_col2im(col, h, w, 6, 7, backend="triton").sum().backward()


def psroipool_launches(dtypes=ACC_DTYPES) -> None:
    ph = pw = 3
    od = 4
    x = torch.randn(2, od * ph * pw, 8, 9)
    rois = torch.tensor([[0, 1.0, 1.0, 6.0, 7.0], [1, 0.0, 2.0, 8.0, 5.0], [0, 3.0, 0.0, 4.0, 2.0]])
    for dtype in dtypes:
        for layout in ("NCHW", "NHWC"):
            xi = _nhwc(x.to(dtype), layout).requires_grad_()
            out, _ = cvops.psroi_pool(xi, rois.to(dtype), ph, pw, 1.0, ph, od, layout, backend="triton")
            out.sum().backward()


def indice_pairs_launches(dtypes=ACC_DTYPES) -> None:
    del dtypes  # the kernel maps have no float inputs
    g = torch.Generator().manual_seed(0)
    coords = torch.unique(torch.randint(0, 6, (40, 3), generator=g), dim=0)
    indices = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int64), coords], 1).to(torch.int32)
    for ndim_indices, shape in ((indices, [6, 6, 6]), (indices[:, [0, 2, 3]], [6, 6])):
        ndim_indices = torch.unique(ndim_indices, dim=0)
        for subm, transpose, stride in ((True, False, 1), (False, False, 2), (False, True, 2)):
            cvops.get_indice_pairs(ndim_indices, 1, shape, 3, stride, 1, subm=subm, transpose=transpose,
                                   backend="triton")


def sparse_conv_launches(dtypes=ACC_DTYPES) -> None:
    indices = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 2], [0, 1, 1, 1]], dtype=torch.int32)
    # a kernel map built on the cpu: the gathers and scatters need its counts, not a triton launch
    _, pairs, num = cvops.get_indice_pairs(indices, 1, [2, 2, 4], (1, 1, 3), 1, (0, 0, 1), subm=True,
                                           backend="cpu")
    for dtype in dtypes:
        feats = torch.randn(len(indices), 16, dtype=dtype, requires_grad=True)
        weight = torch.randn(3, 16, 24, dtype=dtype, requires_grad=True)
        y = indice_conv(feats, weight, pairs, num, len(indices), identity_offset=1, backend="triton")
        y.sum().backward()


ALL = (psamask_launches, carafe_launches, masked_im2col_launches, psroipool_launches, indice_pairs_launches,
       sparse_conv_launches)
# launches whose results steer the next launches (kernel maps: counts, unique sites) run for real
NEED_RESULTS = (indice_pairs_launches,)


def exercise(recorder) -> None:
    """Every op's launches, then the float32 launches again in the int64-index variants, recorded by
    ``recorder``; kernels run only where later launches depend on their results."""
    for dtypes in (None, (torch.float32,)):
        with forced_int64() if dtypes else contextlib.nullcontext():
            for launches in ALL:
                recorder.execute = launches in NEED_RESULTS
                launches() if dtypes is None else launches(dtypes=dtypes)
    recorder.execute = True
