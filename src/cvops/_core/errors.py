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


def _widened(error: CvopsError, peer_types: tuple) -> CvopsError:
    """``error`` as an instance of its own type and ``peer_types`` (same message, status and traceback)."""
    widened_type = _also(type(error), peer_types)
    widened = widened_type.__new__(widened_type, *error.args)
    widened.args = error.args
    widened.__dict__.update(error.__dict__)
    return widened.with_traceback(error.__traceback__)


@contextlib.contextmanager
def raising_also(*peer_types: type, of: type = CvopsError):
    """Re-raise an ``of`` error (a :class:`CvopsError`) from the block as an instance of ``peer_types`` too (same
    message and status), so ``except`` clauses written for a drop-in namespace's peer catch it."""
    try:
        yield
    except of as error:
        raise _widened(error, peer_types) from None


def raises_also(*peer_types: type, of: type = CvopsError):
    """Decorator: the function's ``of`` errors are ``peer_types`` too, as with :func:`raising_also` (a plain
    ``try``: nothing to pay on a call that raises nothing)."""
    def decorate(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except of as error:
                raise _widened(error, peer_types) from None
        return call
    return decorate


# mmcv asserts its arguments: a bad one is an AssertionError there (and a ValueError where mmcv raises one)
asserts_like_mmcv = raises_also(AssertionError, of=BadParamError)
