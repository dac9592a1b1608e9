"""Declaring a cvops operator: one :func:`custom_op` call registers ``torch.library.custom_op("cvops::<name>")``,
its fake implementation and, when the op has one, its backward.

The op's own module keeps what is specific to it: the implementation (annotated: torch reads the op's schema
from the annotations), a fake that returns empty tensors of the results' shapes (``torch.compile`` and meta
tensors run it instead of the kernel), and a backward written against the forward's arguments by name::

    _forward_op = custom_op("psamask_forward", _forward, fake=_forward_fake,
                            backward=lambda saved, grad: _backward_op(grad.contiguous(), saved.psa_type, ...))

What the backward sees (``saved``, a named tuple): every argument of the forward by its parameter name; a
tensor argument listed in ``save`` is kept for the backward (``ctx.save_for_backward``), any other tensor
argument arrives as its shape (a ``torch.Size``), so the autograd graph holds no tensor the backward does not
read. Results listed by position in ``save_outputs`` are kept as ``saved.outputs``; ``saved.needs_input_grad``
is autograd's. The backward returns the gradients of the leading arguments (a tensor or a tuple); the rest
are None. The named-tuple type and the tensor positions are found once per op, at registration.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Callable, Optional, Sequence

import torch

NAMESPACE = "cvops"


def custom_op(name: str, impl: Callable, fake: Callable, *, backward: Optional[Callable] = None,
              save: Sequence[str] = (), save_outputs: Sequence[int] = ()):
    """The operator ``cvops::<name>`` running ``impl``, with ``fake`` registered and, when given, ``backward``
    (``backward(saved, *grads)``, see the module docstring). Returns torch's ``CustomOpDef``: calling it
    calls the op."""
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=())
    op.register_fake(fake)
    if backward is not None:
        _register_backward(op, name, backward, tuple(save), tuple(save_outputs))
    return op


def _register_backward(op, name: str, backward: Callable, save: tuple[str, ...],
                       save_outputs: tuple[int, ...]) -> None:
    arguments = getattr(getattr(torch.ops, NAMESPACE), name).default._schema.arguments
    names = [a.name for a in arguments]
    missing = [n for n in save if n not in names]
    if missing:
        raise TypeError(f"{NAMESPACE}::{name}: save names {missing}, which are not arguments of the op")
    kept = tuple(names.index(n) for n in save)
    shaped = tuple(i for i, a in enumerate(arguments) if str(a.type) == "Tensor" and i not in kept)
    held = [a.name for i, a in enumerate(arguments) if "Tensor" in str(a.type) and i not in kept + shaped]
    if held:
        raise TypeError(f"{NAMESPACE}::{name}: list {held} in save (only plain Tensor arguments pass as shapes)")
    saved_type = namedtuple(f"{name}_saved", names + ["outputs", "needs_input_grad"])
    n_grads = len(names)

    def setup_context(ctx, inputs, output):
        results = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*[inputs[i] for i in kept], *[results[i] for i in save_outputs])
        values = list(inputs)
        for i in shaped:
            values[i] = values[i].shape
        for i in kept:
            values[i] = None  # the saved tensor takes its place in the backward
        ctx.values = values

    def grad_fn(ctx, *grads):
        tensors = ctx.saved_tensors
        values = list(ctx.values)
        for i, t in zip(kept, tensors):
            values[i] = t
        result = backward(saved_type(*values, tensors[len(kept):], ctx.needs_input_grad), *grads)
        result = result if isinstance(result, tuple) else (result,)
        return result + (None,) * (n_grads - len(result))

    op.register_autograd(grad_fn, setup_context=setup_context)
