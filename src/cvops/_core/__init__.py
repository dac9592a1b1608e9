"""Machinery shared by every operator: errors, validation, layouts, dispatch, memory, parallel work."""
from .errors import BadParamError, CvopsError, NotSupportedError, Status

__all__ = ["BadParamError", "CvopsError", "NotSupportedError", "Status"]
