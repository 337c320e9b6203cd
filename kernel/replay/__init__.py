"""Serving replay (issue 29). Requests in: :func:`read_requests` reads a request source,
:func:`generate` builds one from a :class:`LoadSpec`; both give a :class:`RequestSet`."""

from .formats import FORMATS, detect_format, read_requests, write_requests
from .requests import REJECT_SCHEMA, REQUEST_SCHEMA, RequestSet

__all__ = ["FORMATS", "REJECT_SCHEMA", "REQUEST_SCHEMA", "RequestSet", "detect_format",
           "read_requests", "write_requests"]
