"""Shared helpers for the field validators: a problem collector and Go-style value formatting.

Every validator takes a document and its file, walks it once and records every problem it
finds (never stopping at the first). Paths are the dotted key paths of the spec (model.md §12.7)
with ``[i]`` indices; the collector looks up the source line of a path (or of its nearest stated
parent) in the decoder's line map.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from decimal import Decimal

from .errors import Problem

# Closed vocabularies (model.md §12.8).
METHODS = ("measured", "literature", "vendor_spec", "copied", "assumed", "not_charged")
PROVENANCES = ("vendor_spec", "derived")
SOURCE_KINDS = ("discussion", "publication", "datasheet", "model", "vendor_doc")
SOURCE_ROLES = ("primary", "supporting", "upper_bound")
UNITS = ("dimensionless", "us_per_layer", "us_per_request", "us_per_step", "us_per_hop",
         "bytes_per_us", "bytes_per_rank", "us_per_load", "us_per_transfer", "tokens",
         "sm_count", "us_per_token")
DTYPES = ("bf16", "fp16", "fp8", "nvfp4", "mxfp4", "int8", "int4", "fp32")
OPS = ("GEMM", "GroupedGEMM", "Attention", "RecurrentUpdate", "Elementwise", "AllReduce",
       "AllGather", "ReduceScatter", "All2All")
COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "All2All")
ATTENTION_KINDS = ("gqa", "mla", "sparse_mla", "swa")
LATENT_KINDS = ("mla", "sparse_mla")
RECURRENT_KINDS = ("mamba2", "kda", "gdn")
EMIT_CONDITIONS = ("", "tensor_parallel", "expert_parallel", "tensor_parallel_unless_sp_moe")
MODALITIES = ("", "text_only", "text_decoder_of_multimodal")
ROLES = ("colocated", "prefill", "decode")
MODES = ("real", "generated", "replayed")
TIME_UNITS = ("ns", "nanoseconds", "us", "microseconds", "ms", "milliseconds", "s", "seconds")


def go_float(value: float) -> str:
    """A float as Go's ``%v`` prints it: shortest digits, ``+Inf``/``-Inf``/``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    d = Decimal(repr(value))
    exp = d.adjusted()
    if -4 <= exp < 21:
        text = format(d, "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    return repr(value)  # Python and Go agree outside that range: 1e-05, 1.5e+21


def go_list(values: Iterable[object]) -> str:
    """A list as Go's ``%v`` prints it: ``[a b c]``."""
    return "[" + " ".join(str(v) for v in values) + "]"


def quote(value: str) -> str:
    """A string as Go's ``%q`` prints it (double quotes, backslash escapes)."""
    out = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{out.replace(chr(9), chr(92) + "t")}"'


def join(prefix: str, path: str) -> str:
    """Join two dotted paths; an index (``[0]``) joins without a dot."""
    if not prefix:
        return path
    if not path:
        return prefix
    return prefix + path if path.startswith("[") else f"{prefix}.{path}"


def line_of(lines: Mapping[str, int], path: str) -> int:
    """The line of ``path`` in the line map, else of its nearest parent that has one."""
    while path:
        if path in lines:
            return lines[path]
        cut = max(path.rfind("."), path.rfind("["))
        if cut <= 0:
            return lines.get(path.split("[")[0], 0)
        path = path[:cut]
    return 0


class Collector:
    """Accumulates problems for one document; ``at(prefix)`` gives a nested view."""

    def __init__(self, file: str, lines: Mapping[str, int] | None = None,
                 problems: list[Problem] | None = None, base: str = ""):
        self.file = file
        self.lines: Mapping[str, int] = lines or {}
        self.problems: list[Problem] = problems if problems is not None else []
        self.base = base

    def at(self, path: str) -> Collector:
        return Collector(self.file, self.lines, self.problems, join(self.base, path))

    def add(self, path: str, message: str, severity: str = "error", where: str = "",
            rule: str = "") -> None:
        """Record a problem at ``path`` (relative to this view)."""
        self._record(join(self.base, path), message, severity, join(self.base, where), rule)

    def _record(self, path: str, message: str, severity: str, where: str, rule: str) -> None:
        line = line_of(self.lines, path or where)
        if not line and self.lines:  # an absent key: point at the document's first key
            line = min(self.lines.values())
        self.problems.append(Problem(self.file, path, message, severity, rule, line))

    def error(self, path: str, message: str) -> None:
        self.add(path, message)

    def warn(self, where: str, message: str) -> None:
        """A document-level warning: empty path, the location leads the message."""
        at = join(self.base, where)
        self._record("", f"{at}: {message}" if at else message, "warning", at, "")

    # -- table-driven numeric checks ---------------------------------------------------
    def finite(self, path: str, value: float) -> bool:
        if math.isfinite(value):
            return True
        self.error(path, f"must be a finite number, got {go_float(value)}")
        return False

    def at_least_one(self, path: str, value: int) -> None:
        if value < 1:
            self.error(path, f"must be at least 1, got {value}")

    def not_negative(self, path: str, value: float) -> None:
        if value < 0:
            self.error(path, "must not be negative")

    def positive(self, path: str, value: float) -> None:
        """Finite and > 0 (chip, fabric, storage numbers)."""
        if self.finite(path, value) and value <= 0:
            self.error(path, f"must be positive, got {go_float(value)}")

    def fraction(self, path: str, value: float) -> None:
        """Finite, in [0, 1], 0 meaning unset (gpu_memory_utilization)."""
        if self.finite(path, value) and not 0 <= value <= 1:
            self.error(path, f"must lie in [0, 1] (0 means unset), got {go_float(value)}")

    def required(self, path: str, value: str, message: str = "required") -> bool:
        if value:
            return True
        self.error(path, message)
        return False

    def one_of(self, path: str, value: str, allowed: Iterable[str]) -> None:
        """Non-empty and in a closed vocabulary (model.md §12.8 ``UnknownValueError`` text)."""
        allowed = tuple(allowed)
        if not value:
            self.error(path, "required")
        elif value not in allowed:
            self.error(path, f"{quote(value)} is not one of {go_list(sorted(allowed))}")

    def kind(self, value: str, expected: str) -> None:
        if value != expected:
            self.error("kind", f"must be {quote(expected)}, got {quote(value)}")
