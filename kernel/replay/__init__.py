"""Serving replay (issue 29). Requests in: :func:`read_requests` reads a request source,
:func:`generate` builds one from a :class:`LoadSpec` (:func:`parse_load`,
:func:`inference_perf_spec`); both give a :class:`RequestSet` (docs/requests.md).
:func:`replay` runs them through the vLLM scheduler of :mod:`kernel.replay.engine` and prices
every step (:class:`ReplayResult`; :func:`write_replay` writes it; docs/replay.md).
:func:`sweep_rates` replays a source at many rates on many scenarios (capacity planning)."""

from .api import ReplayOptions, open_pools, replay
from .capacity import CapacityResult, sweep_rates, write_capacity
from .formats import FORMATS, detect_format, read_requests, write_requests
from .inference_perf import inference_perf_spec
from .loads import ARRIVALS, LoadSpec, SharedPrefix, Stage, generate, parse_load
from .output import write_replay
from .requests import REJECT_SCHEMA, REQUEST_SCHEMA, RequestSet, scale_rate, summarise
from .results import ReplayResult

__all__ = ["ARRIVALS", "FORMATS", "REJECT_SCHEMA", "REQUEST_SCHEMA", "LoadSpec", "ReplayOptions",
           "ReplayResult", "RequestSet", "SharedPrefix", "Stage", "detect_format", "generate",
           "inference_perf_spec", "open_pools", "parse_load", "read_requests", "replay", "scale_rate",
           "summarise", "write_replay", "write_requests"]
__all__ += ["CapacityResult", "sweep_rates", "write_capacity"]
