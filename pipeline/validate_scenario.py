"""Field checks on a scenario (model.md §12.2). Message texts follow the deployment's style
(the upstream scenario messages were not captured, model.md §12.2)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from .documents import Binding, Cluster, Scenario, TraceHeader, TraceServer
from .errors import Problem
from .validate_common import MODES, TIME_UNITS, Collector, go_float, quote

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


def validate_scenario(doc: Scenario, file: str,
                      lines: Mapping[str, int] | None = None) -> list[Problem]:
    """Every field problem of one scenario; paths relative to the document."""
    c = Collector(file, lines)
    c.kind(doc.kind, "Scenario")
    c.required("name", doc.name)
    c.required("model", doc.model)
    c.required("engine_version", doc.engine_version)
    if not doc.coefficients:
        c.error("coefficients", "at least one coefficient set is required")
    for i, name in enumerate(doc.coefficients):
        c.required(f"coefficients[{i}]", name, "required: names a registry coefficient set")
    if doc.workload is not None:
        _binding(c.at("workload"), doc.workload)
    _cluster(c.at("cluster"), doc.cluster)
    return c.problems


def _cluster(c: Collector, cl: Cluster) -> None:
    c.required("hardware", cl.hardware, "required: a scenario must name a hardware")
    c.at_least_one("nodes", cl.nodes)
    c.at_least_one("gpus_per_node", cl.gpus_per_node)
    if cl.nodes > 1 and not cl.fabric:
        c.error("fabric", f"required: a cluster of {cl.nodes} nodes needs an inter-node fabric")
    if cl.gpus_per_rack < 0:
        c.error("gpus_per_rack", "must not be negative")
    elif cl.gpus_per_rack and cl.gpus_per_node >= 1 and cl.gpus_per_rack % cl.gpus_per_node:
        c.error("gpus_per_rack", f"{cl.gpus_per_rack} is not a multiple of gpus_per_node "
                f"{cl.gpus_per_node}")
    seen: set[str] = set()
    for i, tier in enumerate(cl.storage):
        if not tier:
            c.error(f"storage[{i}]", "required: names a catalog device class")
        elif tier in seen:
            c.error(f"storage[{i}]", f"duplicate tier {quote(tier)}")
        seen.add(tier)


def _binding(c: Collector, b: Binding) -> None:
    if b.shape and b.trace is not None:
        c.error("", "states both shape and trace; a workload binding names exactly one")
        return
    if not b.shape and b.trace is None:
        c.error("", "names neither shape nor trace; omit workload to pose no traffic")
        return
    if b.trace is None:
        return
    t = c.at("trace")
    tr = b.trace
    t.required("data", tr.data, "required: the path of the per-request CSV")
    if tr.sha256 and not _HEX64.match(tr.sha256):
        t.error("sha256", f"must be exactly 64 hex digits, got {quote(tr.sha256)}")
    t.not_negative("rows", tr.rows)
    _header(t.at("header"), tr.header)


def _header(c: Collector, h: TraceHeader) -> None:
    c.at_least_one("trace_version", h.trace_version)
    c.one_of("time_unit", h.time_unit, TIME_UNITS)
    c.one_of("mode", h.mode, MODES)
    if h.server is not None:
        _server(c.at("server"), h.server)
    for name, targets in h.goodput_slo_targets.items():
        if not name:
            c.error("goodput_slo_targets", "a class name must not be empty")
            continue
        cls = c.at(f"goodput_slo_targets.{name}")
        values = {"ttft_ms": targets.ttft_ms, "itl_ms": targets.itl_ms,
                  "e2e_ms": targets.e2e_ms}
        for key, value in values.items():
            if cls.finite(key, value) and value < 0:
                cls.error(key, f"must not be negative, got {go_float(value)}")
        if not any(v > 0 for v in values.values()):
            cls.error("", "a class must set at least one positive target "
                      "(ttft_ms, itl_ms or e2e_ms); 0 means unconstrained")


def _server(c: Collector, s: TraceServer) -> None:
    for key in ("tensor_parallel", "max_num_seqs", "block_size", "max_model_len"):
        c.not_negative(key, getattr(s, key))
    c.fraction("gpu_memory_utilization", s.gpu_memory_utilization)
