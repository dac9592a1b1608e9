"""Sparse convolution on a kernel map: ``indice_conv`` forward and backward, as torch custom ops.

Shapes (K = prod(kernel_size), N = input rows, M = output rows):

- ``features [N, C_in]`` floating (float16, bfloat16, float32, float64);
- ``weight [K, C_in, C_out]`` (or ``[*kernel_size, C_in, C_out]``, the mmcv layout, flattened here);
- ``indice_pairs [K, 2, L]`` int32/int64 and ``indice_num [K]``, the kernel map of
  :func:`cvops.get_indice_pairs`: ``pairs[k, 0, i]`` input row, ``pairs[k, 1, i]`` output row,
  valid for ``i < indice_num[k]``;
- returns ``[num_out, C_out]``: ``out[pairs[k,1,i]] += features[pairs[k,0,i]] @ weight[k]``.

``inverse=True`` runs the map backwards (``SparseInverseConv``): gather from ``pairs[k, 1]`` and
scatter to ``pairs[k, 0]``. ``identity_offset`` names the subm offset whose pairs are ``(i, i)`` for
every row (``-1``: none); it is computed as one dense matmul.

Backward gives ``grad_features`` and ``grad_weight``; both are deterministic (see ``cpu.py``).
"""
from __future__ import annotations

import math

import torch

from .._core.autocast import mixed_to_float32
from .._core.dispatch import backend_module, check_backend, resolve_backend
from .._core.opdef import custom_op
from .._core.validate import FLOAT_DTYPES, INDEX_DTYPES, check_int, check_tensor, require

OP = "indice_conv"


# ----------------------------------------------------------------------------- checks
def check_indice_conv(features, weight, indice_pairs, indice_num, num_out, inverse, identity_offset_,
                      check_values: bool = True):
    """Every rule of the kernel-map convolution; raises ``BadParamError`` naming the argument
    (``check_values``: see :func:`_indice_conv`)."""
    check_tensor(OP, "features", features, dim=2, dtypes=FLOAT_DTYPES)
    check_tensor(OP, "weight", weight, dim=3, dtypes=FLOAT_DTYPES)
    check_tensor(OP, "indice_pairs", indice_pairs, dim=3, dtypes=INDEX_DTYPES)
    check_tensor(OP, "indice_num", indice_num, dim=1, dtypes=INDEX_DTYPES)
    num_out = check_int(OP, "num_out", num_out, min_value=0)
    require(isinstance(inverse, bool), OP, f"inverse must be a bool, got {inverse!r}")
    require(weight.dtype == features.dtype, OP,
            f"weight dtype ({weight.dtype}) must equal features dtype ({features.dtype})")
    require(weight.device == features.device and indice_pairs.device == features.device, OP,
            f"features ({features.device}), weight ({weight.device}) and indice_pairs "
            f"({indice_pairs.device}) must be on one device")
    K, c_in, _ = weight.shape
    require(c_in == features.shape[1], OP,
            f"weight in_channels ({c_in}) must equal features channels ({features.shape[1]})")
    require(indice_pairs.shape[0] == K and indice_pairs.shape[1] == 2, OP,
            f"indice_pairs must be [K={K}, 2, L], got {tuple(indice_pairs.shape)}")
    require(indice_num.shape[0] == K, OP, f"indice_num must have K={K} entries, got {indice_num.shape[0]}")
    n_src, n_dst = features.shape[0], num_out
    # pairs[k, 0] indexes the conv's input rows, pairs[k, 1] its output rows; inverse swaps roles
    n_col0, n_col1 = (n_dst, n_src) if inverse else (n_src, n_dst)
    L = indice_pairs.shape[2]
    identity_offset_ = check_int(OP, "identity_offset", identity_offset_, min_value=-1)
    require(identity_offset_ < K, OP, f"identity_offset ({identity_offset_}) must be < K ({K})")
    if torch.compiler.is_compiling():
        return num_out  # value checks read the map's data; under torch.compile only shapes are checked
    counts = indice_num.cpu()
    if K and not (int(counts.min()) >= 0 and int(counts.max()) <= L):  # the message only on failure
        require(False, OP, f"indice_num values must lie in [0, L={L}], got {counts.tolist()}")
    if check_values and K and L and int(counts.max()) > 0:
        # only the valid prefix of each offset is read; its values must index real rows
        width = int(counts.max())
        valid = torch.arange(width, device=indice_pairs.device) < indice_num.to(indice_pairs.device)[:, None]
        for col, rows, name in ((0, n_col0, "input"), (1, n_col1, "output")):
            vals = indice_pairs[:, col, :width][valid]
            lo, hi = (int(v) for v in torch.aminmax(vals))
            require(lo >= 0 and hi < rows, OP,
                    f"indice_pairs[:, {col}] ({name} rows) must lie in [0, {rows}) where valid, "
                    f"got values in [{lo}, {hi}]")
    if identity_offset_ >= 0:
        require(n_src == n_dst and int(counts[identity_offset_]) == n_src, OP,
                f"identity_offset {identity_offset_} needs as many output rows ({n_dst}) as input rows "
                f"({n_src}) and indice_num[{identity_offset_}] == {n_src}, got {int(counts[identity_offset_])}")
    return num_out


def check_rows_unique_per_offset(indice_pairs: torch.Tensor, indice_num: torch.Tensor) -> None:
    """Within each offset, no input row and no output row may repeat (true of every kernel map).

    The Triton scatter relies on it: each destination row of a launch is owned by one program.
    """
    K, _, L = indice_pairs.shape
    if K == 0 or L < 2:
        return
    big = torch.iinfo(torch.int64).max
    valid = torch.arange(L, device=indice_pairs.device) < indice_num.to(indice_pairs.device)[:, None]
    for col, name in ((0, "input"), (1, "output")):
        rows = torch.sort(torch.where(valid, indice_pairs[:, col].long(), big), dim=1).values
        repeated = (rows[:, 1:] == rows[:, :-1]) & (rows[:, 1:] != big)
        require(not bool(repeated.any()), OP,
                f"indice_pairs repeats an {name} row within one kernel offset (a kernel map pairs each row at "
                "most once per offset)")


# ----------------------------------------------------------------------------- custom ops
def _conv(features: torch.Tensor, weight: torch.Tensor, pairs_forward: torch.Tensor, pairs_backward: torch.Tensor,
          indice_num: torch.Tensor, num_out: int, inverse: bool, identity_offset: int,
          backend: str | None) -> torch.Tensor:
    # pairs_forward / pairs_backward: the same map, each offset ordered by the rows it scatters into
    impl = backend_module(__package__, OP, backend, features.device, features, weight)
    return impl.forward(features, weight, pairs_forward, indice_num, num_out, inverse, identity_offset)


def _conv_fake(features, weight, pairs_forward, pairs_backward, indice_num, num_out, *_):
    return features.new_empty(num_out, weight.shape[2])


def _conv_grad(s, grad_out):
    return _indice_conv_backward_op(grad_out, s.features, s.weight, s.pairs_backward, s.indice_num, s.inverse,
                                    s.identity_offset, s.backend)


def _conv_backward(grad_out: torch.Tensor, features: torch.Tensor, weight: torch.Tensor, indice_pairs: torch.Tensor,
                   indice_num: torch.Tensor, inverse: bool, identity_offset: int,
                   backend: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    impl = backend_module(__package__, OP, backend, features.device, grad_out, features, weight)
    grad_features, grad_weight = impl.backward(grad_out.contiguous(), features, weight, indice_pairs, indice_num,
                                               inverse, identity_offset)
    return grad_features, grad_weight.contiguous()  # the weight may be a strided view (the layers' spconv layout)


def _conv_backward_fake(grad_out, features, weight, *_):
    return torch.empty_like(features), weight.new_empty(weight.shape)


_indice_conv_op = custom_op("sparse_indice_conv", _conv, _conv_fake, backward=_conv_grad,
                            save=("features", "weight", "pairs_backward", "indice_num"))
_indice_conv_backward_op = custom_op("sparse_indice_conv_backward", _conv_backward, _conv_backward_fake)


# ----------------------------------------------------------------------------- public API
def indice_conv(features: torch.Tensor, weight: torch.Tensor, indice_pairs: torch.Tensor,
                indice_num: torch.Tensor, num_out: int, *, inverse: bool = False,
                identity_offset: int = -1, indice_pairs_by_output: torch.Tensor | None = None,
                backend: str | None = None) -> torch.Tensor:
    """Sparse convolution of ``features [N, C_in]`` on a kernel map; returns ``[num_out, C_out]``.

    ``weight`` is ``[K, C_in, C_out]`` or the mmcv layout ``[*kernel_size, C_in, C_out]``. See the
    module docstring for the pair semantics, ``inverse`` and ``identity_offset``. ``backend``:
    ``None`` (the device's default), ``"reference"``, ``"torch"``, ``"numba"`` or ``"triton"``; ``"cpu"`` still
    means the CPU default.
    ``indice_pairs_by_output``: optionally :func:`sort_pairs_by_output` of the map (cached by the
    layers), used where rows are scattered into output rows; the result is the same without it.
    Every pair value is range-checked against ``features`` and ``num_out`` before any kernel runs.
    Memory on the CPU: the output, a sorted copy of the map when it is not in output-row order (the layers
    pass it sorted), and blocks of a few MiB per worker thread.
    """
    return _indice_conv(features, weight, indice_pairs, indice_num, num_out, inverse=inverse,
                        identity_offset=identity_offset, indice_pairs_by_output=indice_pairs_by_output,
                        backend=backend, check_values=True)


def _indice_conv(features, weight, indice_pairs, indice_num, num_out, *, inverse, identity_offset,
                 indice_pairs_by_output, backend, check_values: bool):
    """:func:`indice_conv`; ``check_values=False`` (the layers only) skips the O(K*L) scan of the pair
    values for a map that :func:`cvops.get_indice_pairs` built on exactly these ``features``' sites in
    the same call chain. Shapes and counts are still checked, and the compiled layer checks every
    row index itself, so even a wrong map cannot reach memory outside the arrays."""
    features, weight = mixed_to_float32(features, weight)
    check_tensor(OP, "weight", weight, dtypes=FLOAT_DTYPES)
    require(weight.dim() >= 3, OP, f"weight must be [K, C_in, C_out] or [*k, C_in, C_out], got {tuple(weight.shape)}")
    weight = weight.reshape(math.prod(weight.shape[:-2]), weight.shape[-2], weight.shape[-1])
    num_out = check_indice_conv(features, weight, indice_pairs, indice_num, num_out, inverse, identity_offset,
                                check_values)
    check_backend(__package__, OP, backend, features.device, features, weight)
    by_input = indice_pairs.contiguous()
    if indice_pairs_by_output is None:
        by_output = by_input
    else:
        check_tensor(OP, "indice_pairs_by_output", indice_pairs_by_output, dtypes=(indice_pairs.dtype,))
        require(indice_pairs_by_output.shape == indice_pairs.shape and
                indice_pairs_by_output.device == indice_pairs.device, OP,
                f"indice_pairs_by_output must match indice_pairs {tuple(indice_pairs.shape)} on {indice_pairs.device}")
        check_indice_conv(features, weight, indice_pairs_by_output, indice_num, num_out, inverse, identity_offset,
                          check_values)
        by_output = indice_pairs_by_output.contiguous()
    if check_values and not torch.compiler.is_compiling() and \
            resolve_backend(__package__, OP, backend, features.device, features, weight) == "triton":
        check_rows_unique_per_offset(by_input, indice_num)
    # forward scatters into the output rows (input rows when inverse), backward into the others
    pairs_forward, pairs_backward = (by_input, by_output) if inverse else (by_output, by_input)
    # the weight as given (the layers pass a permuted view of their parameter): a contiguous copy saved for the
    # backward would hold every layer's weight again until then; the kernels copy it for their call only
    return _indice_conv_op(features.contiguous(), weight, pairs_forward, pairs_backward,
                           indice_num.cpu(), num_out, inverse, int(identity_offset), backend)
