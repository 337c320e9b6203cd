"""Serving replay (issue 29). Requests in: :func:`read_requests` reads a request source,
:func:`generate` builds one from a :class:`LoadSpec` (:func:`parse_load`,
:func:`inference_perf_spec`); both give a :class:`RequestSet` (docs/requests.md)."""

from .formats import FORMATS, detect_format, read_requests, write_requests
from .inference_perf import inference_perf_spec
from .loads import ARRIVALS, LoadSpec, SharedPrefix, Stage, generate, parse_load
from .requests import REJECT_SCHEMA, REQUEST_SCHEMA, RequestSet, scale_rate, summarise

__all__ = ["ARRIVALS", "FORMATS", "REJECT_SCHEMA", "REQUEST_SCHEMA", "LoadSpec", "RequestSet",
           "SharedPrefix", "Stage", "detect_format", "generate", "inference_perf_spec",
           "parse_load", "read_requests", "scale_rate", "summarise", "write_requests"]
