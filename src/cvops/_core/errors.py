"""MLU-OPS status codes and the exceptions the functional API raises.

Every functional-API error subclasses ``ValueError`` (bad parameter) or ``NotImplementedError``
(unsupported) and carries the MLU-OPS status, so one check serves both API levels: the
MLU-OPS-style layer catches ``CvopsError`` and returns ``err.status``.
"""
from __future__ import annotations

import contextlib
import enum
import functools


class Status(enum.IntEnum):
    """``mluOpStatus_t`` values."""

    SUCCESS = 0
    NOT_INITIALIZED = 1
    ALLOC_FAILED = 2
    BAD_PARAM = 3
    INTERNAL_ERROR = 4
    ARCH_MISMATCH = 5
    EXECUTION_FAILED = 6
    NOT_SUPPORTED = 7
    NUMERICAL_OVERFLOW = 8


class CvopsError(Exception):
    """Base of every cvops error; ``status`` is the MLU-OPS status it maps to."""

    status: Status = Status.INTERNAL_ERROR

    def __init__(self, op: str, message: str):
        super().__init__(f"{op}: {message}")
        self.op = op


class BadParamError(CvopsError, ValueError):
    """A parameter breaks a rule of the operator (MLU-OPS ``BAD_PARAM``)."""

    status = Status.BAD_PARAM


class NotSupportedError(CvopsError, NotImplementedError):
    """Valid input the operator or backend does not handle (MLU-OPS ``NOT_SUPPORTED``)."""

    status = Status.NOT_SUPPORTED


@functools.lru_cache(maxsize=None)
def _also(error_type: type, peer_types: tuple) -> type:
    return type(error_type.__name__, (error_type, *peer_types), {"__module__": error_type.__module__})


@contextlib.contextmanager
def raising_also(*peer_types: type, of: type = CvopsError):
    """Re-raise an ``of`` error (a :class:`CvopsError`) from the block as an instance of ``peer_types`` too (same
    message and status), so ``except`` clauses written for a drop-in namespace's peer catch it."""
    try:
        yield
    except of as error:
        widened_type = _also(type(error), peer_types)
        widened = widened_type.__new__(widened_type, *error.args)
        widened.args = error.args
        widened.__dict__.update(error.__dict__)
        raise widened.with_traceback(error.__traceback__) from None


def raises_also(*peer_types: type, of: type = CvopsError):
    """Decorator: the function's ``of`` errors are ``peer_types`` too (:func:`raising_also` around each call)."""
    def decorate(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            with raising_also(*peer_types, of=of):
                return fn(*args, **kwargs)
        return call
    return decorate


# mmcv asserts its arguments: a bad one is an AssertionError there (and a ValueError where mmcv raises one)
asserts_like_mmcv = raises_also(AssertionError, of=BadParamError)
