"""Compile every op's numba kernels ahead of time, into numba's disk cache: ``python -m cvops.precompile``.

A CPU kernel compiles on the first call that meets a new argument type (dtype, array layout) and numba
caches the machine code on disk, so later processes only load it. On an empty cache those first calls
take seconds to minutes; run this where the cache will live (a Docker image build, a CI cache step) so
that no user call pays it. It calls each op on small inputs in every form the kernels take: float32,
float64, float16 and bfloat16, NCHW and NHWC storage, forward and backward (autograd and the direct
backward entry points).

    python -m cvops.precompile [--ops carafe psamask ...]

The cache goes where numba puts it: ``NUMBA_CACHE_DIR`` when set, else the package's ``__pycache__``
folders when writable, else ``~/.cache/numba``. Set the same ``NUMBA_CACHE_DIR`` where the ops run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Iterator

import torch

import cvops
from cvops._core import jit

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
LAYOUTS = ("NCHW", "NHWC")


def _randn(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def _input(n, c, h, w, dtype, layout: str) -> torch.Tensor:
    """A random leaf of NCHW shape, or of NHWC shape for ``layout="NHWC"`` (the ops' ``layout`` argument)."""
    t = _randn(n, c, h, w, dtype=dtype)
    return (t.permute(0, 2, 3, 1).contiguous() if layout == "NHWC" else t).requires_grad_()


def _backward(out: torch.Tensor) -> None:
    out.backward(torch.ones_like(out))


def _psamask(dtype, layout) -> None:
    # (4, 5) under a 9 x 9 mask: the row kernels; (6, 9) under 5 x 5 in NCHW: the sheared-tile kernels
    for h, w, mask in ((4, 5, 9), (6, 9, 5)):
        for psa_type in ("collect", "distribute"):
            _backward(cvops.psamask(_input(1, mask * mask, h, w, dtype, layout), psa_type, mask, layout))


def _masked_im2col(dtype, layout) -> None:
    feature = _randn(1, 4, 6, 7, dtype=dtype)  # NHWC: channels-last storage (the op has no layout argument)
    feature = (feature.contiguous(memory_format=torch.channels_last) if layout == "NHWC" else feature).requires_grad_()
    h, w = torch.tensor([0, 2, 5, 3]), torch.tensor([1, 6, 0, 3])
    _backward(cvops.masked_im2col(feature, h, w, 3, 1))
    col = _randn(4, 4, dtype=dtype).requires_grad_()
    _backward(cvops.masked_col2im(col, h, w, 6, 7))
    if dtype in (torch.float32, torch.float64):  # masked_conv2d's own CPU routes: float32 / float64
        mask = torch.zeros(1, 64, 64)
        mask[0, h, w] = 1
        big = _randn(1, 4, 64, 64, dtype=dtype)
        with torch.no_grad():  # few points on a larger map; few and many output channels take other routes
            for out_channels in (3, 40):
                cvops.masked_conv2d(big, mask, _randn(out_channels, 4, 3, 3, dtype=dtype), None, 1)
        weight = _randn(3, 4, 3, 3, dtype=dtype).requires_grad_()
        _backward(cvops.masked_conv2d(big.requires_grad_(), mask, weight, None, 1))


def _carafe(dtype, layout) -> None:
    features, masks = _input(1, 8, 5, 6, dtype, layout), _input(1, 25, 10, 12, dtype, layout)
    _backward(cvops.carafe(features, masks, 5, 1, 2, layout))


def _psroipool(dtype, layout) -> None:
    x = _input(2, 2 * 9, 6, 7, dtype, layout)
    rois = torch.tensor([[0, 0.0, 1.0, 5.0, 4.0], [1, 2.0, 0.0, 6.0, 5.0]], dtype=dtype)
    out, mapping = cvops.psroi_pool(x, rois, 3, 3, 1.0, 3, 2, layout)
    _backward(out)
    # the direct entry point checks a mapping it did not make
    cvops.psroi_pool_backward(torch.ones_like(out), rois, mapping, 1.0, 2, tuple(x.shape), layout)


def _get_indice_pairs(dtype, layout) -> None:
    indices = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 2], [0, 2, 2, 2], [1, 1, 2, 2]], dtype=torch.int32)
    for subm in (True, False):
        cvops.get_indice_pairs(indices, 2, [3, 3, 3], 3, 1, 1, subm=subm)


def _sparse_conv(dtype, layout) -> None:
    from cvops.sparse import SparseConvTensor, SparseConv3d, SparseSequential, SubMConv3d
    from cvops.sparse.synthetic import uniform_voxels

    indices = uniform_voxels(300, 1, [8, 16, 16])  # in shuffled order: the maps are sorted by row first
    net = SparseSequential(SubMConv3d(4, 8, 3, indice_key="s1"), SparseConv3d(8, 8, 3, 2, 1)).to(dtype)
    features = _randn(len(indices), 4, dtype=dtype).requires_grad_()
    _backward(net(SparseConvTensor(features, indices, [8, 16, 16], 1)).features)


OPS: dict[str, tuple[Callable, tuple, tuple]] = {  # op -> (step, dtypes, layouts)
    "psamask": (_psamask, DTYPES, LAYOUTS),
    "masked_im2col": (_masked_im2col, DTYPES, LAYOUTS),
    "carafe": (_carafe, DTYPES, LAYOUTS),
    "psroipool": (_psroipool, DTYPES, LAYOUTS),
    "get_indice_pairs": (_get_indice_pairs, (torch.int32,), ("-",)),
    "sparse_conv": (_sparse_conv, (torch.float32, torch.float64), ("-",)),
}


def steps(ops) -> Iterator[tuple[str, Callable[[], None]]]:
    """``(label, call)`` for every op in ``ops`` and form it takes."""
    for name in ops:
        step, dtypes, layouts = OPS[name]
        for dtype in dtypes:
            for layout in layouts:
                label = f"{name} {str(dtype).removeprefix('torch.')}" + ("" if layout == "-" else f" {layout}")
                yield label, lambda step=step, dtype=dtype, layout=layout: step(dtype, layout)


def _compiled_signatures() -> int:
    from numba.extending import is_jitted

    return sum(len(v.signatures) for module in list(sys.modules.values())
               if getattr(module, "__name__", "").startswith("cvops.") and module.__name__.endswith("_numba")
               for v in vars(module).values() if is_jitted(v))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cvops.precompile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", choices=list(OPS), default=list(OPS), help="ops to compile (all)")
    args = parser.parse_args(argv)
    os.environ[jit.ENV_SWITCH] = "1"  # this process compiles, whatever the environment says for the ops
    if not jit.numba_available():
        print("numba does not import here: the CPU ops run their torch code and have nothing to compile")
        return 1
    todo = list(steps(args.ops))
    start, tty = time.perf_counter(), sys.stdout.isatty()

    def show(done: int, label: str) -> None:  # one line redrawn on a terminal, a line per step elsewhere
        line = f"[{done}/{len(todo)}] {label} ({time.perf_counter() - start:.1f} s)"
        print(f"\r{line:<72}" if tty else line, end="" if tty else "\n", flush=True)

    try:
        for done, (label, call) in enumerate(todo):
            show(done, label)
            call()
        show(len(todo), "done")
    finally:
        if tty:
            print()
    where = os.environ.get("NUMBA_CACHE_DIR") or "numba's default cache (__pycache__ or ~/.cache/numba)"
    print(f"{_compiled_signatures()} kernel signatures compiled or loaded in {time.perf_counter() - start:.1f} s;"
          f" cache: {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
