"""Machinery shared by every operator: errors, validation, layouts, dispatch, metrics, benchmarks."""
from .errors import BadParamError, CvopsError, NotSupportedError, Status

__all__ = ["BadParamError", "CvopsError", "NotSupportedError", "Status"]
