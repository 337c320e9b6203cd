"""Documents → Arrow tables: one row per fact, keyed so several scenarios share a database.

Every table here is documented in ``docs/tables.md``. Scenario-level tables are keyed by the
scenario name; catalog and registry tables by the document's own name (chip, fabric, graph,
device, coefficient set, rules version), so the same catalog document named by two scenarios
is one set of rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from .arrow_schema import Fields, Item, Key, Part, schema, table
from .documents import (
    Chip,
    Cluster,
    CoefficientEntry,
    CoefficientSet,
    Deployment,
    Fabric,
    Graph,
    LayerKind,
    Node,
    Pool,
    Scenario,
    StorageDevice,
    Tier,
)
from .rules import RulesPack

HEAD_KIND = "__head__"  # reserved layer-kind id under which the graph's head nodes are stored

_I = pa.int64()
_S = pa.string()

# Each table: the key columns this module supplies, then the columns of the document records
# (derived from the dataclasses in pipeline/documents.py by pipeline/arrow_schema.py).
TABLES: dict[str, tuple[Part, ...]] = {
    # One row joins the scenario, its deployment, the graph's name and the rules pack used.
    "scenarios": (Key("scenario", _S), Key("file", _S), Key("model", _S),
                  Fields(Scenario, stop="workload"), Key("rules_version", _S),
                  Fields(Deployment), Fields(Scenario, start="workload")),
    "scenario_coefficient_sets": (Key("scenario", _S), Key("position", _I),
                                  Item(Scenario, "coefficients")),
    # how the scenario was opened (Repos options), not a document field
    "scenario_options": (Key("scenario", _S), Key("assumed_collective_widths", pa.bool_())),
    "scenario_storage": (Key("scenario", _S), Key("position", _I), Item(Cluster, "storage")),
    "offload_tiers": (Key("scenario", _S), Key("position", _I), Fields(Tier)),
    "pools": (Key("scenario", _S), Key("pool", _I), Fields(Pool)),
    "models": (Fields(Graph),),
    "graph_layer_kinds": (Key("model", _S), Key("layer_kind", _S), Key("kind_position", _I),
                          Fields(LayerKind)),
    "graph_nodes": (Key("model", _S), Key("layer_kind", _S), Key("kind_position", _I),
                    Key("node_index", _I), Fields(Node)),
    # The graph's stack expanded: the section is the Stack field a layer comes from.
    "graph_stack": (Key("model", _S), Key("position", _I), Key("layer_kind", _S),
                    Key("section", _S)),
    "chips": (Fields(Chip),),
    "fabrics": (Fields(Fabric),),
    "storage_devices": (Fields(StorageDevice),),
    "coefficients": (Key("set", _S), Key("entry_index", _I), Fields(CoefficientEntry)),
    "rules": (Key("version", _S), Key("category", _S), Key("position", _I), Key("value", _S)),
}

SCHEMAS: dict[str, pa.Schema] = {name: schema(parts) for name, parts in TABLES.items()}

# The key column that identifies one document's rows in each table (its first column).
DOCUMENT_KEYS: dict[str, str] = {name: s.names[0] for name, s in SCHEMAS.items()}


def _table(name: str, rows: list[dict[str, Any]]) -> pa.Table:
    return table(TABLES[name], rows, SCHEMAS[name])


def scenario_tables(key: str, file: str, scen: Scenario, dep: Deployment, graph: Graph,
                    rules: RulesPack, *, assumed_collective_widths: bool = True
                    ) -> dict[str, pa.Table]:
    """The scenario-level tables for one scenario (named ``key``)."""
    tiers = dep.offload.tiers if dep.offload else ()
    return {
        "scenarios": _table("scenarios", [{
            "scenario": key, "file": file, "model": graph.name, "rules_version": rules.version,
            "Scenario": scen, "Deployment": dep}]),
        "scenario_coefficient_sets": _table("scenario_coefficient_sets", [
            {"scenario": key, "position": i, "Scenario.coefficients": s}
            for i, s in enumerate(scen.coefficients)]),
        "scenario_storage": _table("scenario_storage", [
            {"scenario": key, "position": i, "Cluster.storage": t}
            for i, t in enumerate(scen.cluster.storage)]),
        "offload_tiers": _table("offload_tiers", [
            {"scenario": key, "position": i, "Tier": t} for i, t in enumerate(tiers)]),
        "pools": _table("pools", [{"scenario": key, "pool": i, "Pool": p}
                                  for i, p in enumerate(dep.pools)]),
        "scenario_options": _table("scenario_options", [
            {"scenario": key, "assumed_collective_widths": assumed_collective_widths}]),
    }


def graph_tables(graph: Graph) -> dict[str, pa.Table]:
    """models, graph_layer_kinds, graph_nodes (head under ``__head__``), graph_stack."""
    model = graph.name
    # The head is stored as one more layer kind, after the declared ones.
    kinds = (*graph.layer_kinds, LayerKind(id=HEAD_KIND, nodes=graph.head))
    st = graph.stack
    sections = ([("prologue", k) for k in st.prologue]
                + [("pattern", k) for _ in range(max(st.repeat, 0)) for k in st.pattern]
                + [("epilogue", k) for k in st.epilogue])
    return {
        "models": _table("models", [{"Graph": graph}]),
        "graph_layer_kinds": _table("graph_layer_kinds", [
            {"model": model, "layer_kind": lk.id, "kind_position": pos, "LayerKind": lk}
            for pos, lk in enumerate(kinds)]),
        "graph_nodes": _table("graph_nodes", [
            {"model": model, "layer_kind": lk.id, "kind_position": pos, "node_index": i,
             "Node": n}
            for pos, lk in enumerate(kinds) for i, n in enumerate(lk.nodes)]),
        "graph_stack": _table("graph_stack", [
            {"model": model, "position": i, "layer_kind": k, "section": section}
            for i, (section, k) in enumerate(sections)]),
    }


def chip_table(chip: Chip) -> pa.Table:
    return _table("chips", [{"Chip": chip}])


def fabric_table(fabric: Fabric) -> pa.Table:
    return _table("fabrics", [{"Fabric": fabric}])


def device_table(devices: tuple[StorageDevice, ...]) -> pa.Table:
    return _table("storage_devices", [{"StorageDevice": d} for d in devices if d is not None])


def coefficient_table(cset: CoefficientSet) -> pa.Table:
    return _table("coefficients", [{"set": cset.name, "entry_index": i, "CoefficientEntry": e}
                                   for i, e in enumerate(cset.coefficients)])


def rules_table(pack: RulesPack) -> pa.Table:
    rows: list[dict[str, Any]] = []
    for f in dataclasses.fields(pack):
        if f.name == "version":
            continue
        value = getattr(pack, f.name)
        if isinstance(value, frozenset):
            items: list[Any] = sorted(value, key=str)
        elif isinstance(value, tuple):
            items = list(value)
        else:
            items = [value]
        rows.extend({"version": pack.version, "category": f.name, "position": i,
                     "value": str(v)} for i, v in enumerate(items))
    if not pack.dcp_comm_backends:
        # Record that the pack states no list (distinct from a list that is present).
        rows.append({"version": pack.version, "category": "dcp_comm_backends_absent",
                     "position": 0, "value": "true"})
    return _table("rules", rows)
