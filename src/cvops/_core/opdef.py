"""Declaring a cvops operator: one :func:`custom_op` call registers ``torch.library.custom_op("cvops::<name>")``,
its fake implementation and, when the op has one, its backward.

The op's own module keeps what is specific to it: the implementation (annotated: torch reads the op's schema
from the annotations), a fake that returns empty tensors of the results' shapes (``torch.compile`` and meta
tensors run it instead of the kernel), and a backward written against the forward's arguments by name::

    _forward_op = custom_op("psamask_forward", _forward, fake=_forward_fake,
                            backward=lambda saved, grad: _backward_op(grad.contiguous(), saved.psa_type, ...))

What the backward sees (``saved``): every argument of the forward by its parameter name; a tensor argument
listed in ``save`` is kept for the backward (``ctx.save_for_backward``), any other tensor argument arrives as
its shape (a ``torch.Size``), so the autograd graph holds no tensor the backward does not read. Results
listed by position in ``save_outputs`` are kept as ``saved.outputs``; ``saved.needs_input_grad`` is autograd's.
The backward returns the gradients of the leading arguments (a tensor or a tuple); the rest are None.

The registered op is the same ``torch.ops.cvops.<name>`` that ``torch.library`` would build by hand, so
``_core/autocast.py`` (autocast kernels by op name) and ``_core/dispatch.defer_dynamo_import`` (every
``cvops::`` op) apply to it unchanged.
"""
from __future__ import annotations

import inspect
from typing import Callable, Optional, Sequence

import torch

NAMESPACE = "cvops"


class Saved:
    """The forward's arguments (and kept results) as attributes, for a backward."""

    def __init__(self, values: dict):
        self.__dict__.update(values)


def custom_op(name: str, impl: Callable, fake: Callable, *, backward: Optional[Callable] = None,
              save: Sequence[str] = (), save_outputs: Sequence[int] = ()):
    """The operator ``cvops::<name>`` running ``impl``, with ``fake`` registered and, when given, ``backward``
    (``backward(saved, *grads)``, see the module docstring). Returns torch's ``CustomOpDef``: calling it
    calls the op."""
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=())
    op.register_fake(fake)
    if backward is not None:
        _register_backward(op, list(inspect.signature(impl).parameters), backward, tuple(save), tuple(save_outputs))
    return op


def _register_backward(op, names: list[str], backward: Callable, save: tuple[str, ...],
                       save_outputs: tuple[int, ...]) -> None:
    missing = [n for n in save if n not in names]
    if missing:
        raise TypeError(f"{op._qualname}: save names {missing}, which are not arguments of the op")
    kept = [names.index(n) for n in save]

    def setup_context(ctx, inputs, output):
        results = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*(inputs[i] for i in kept), *(results[i] for i in save_outputs))
        ctx.arguments = {n: v.shape if isinstance(v, torch.Tensor) else v
                         for n, v in zip(names, inputs) if n not in save}

    def grad_fn(ctx, *grads):
        tensors = ctx.saved_tensors
        saved = Saved(ctx.arguments)
        saved.__dict__.update(zip(save, tensors))
        saved.outputs = tensors[len(save):]
        saved.needs_input_grad = ctx.needs_input_grad
        result = backward(saved, *grads)
        result = result if isinstance(result, tuple) else (result,)
        return result + (None,) * (len(names) - len(result))

    op.register_autograd(grad_fn, setup_context=setup_context)
