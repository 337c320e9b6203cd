"""Documents → Arrow tables: one row per fact, keyed so several scenarios share a database.

Every table here is documented in ``docs/tables.md``. Scenario-level tables are keyed by the
scenario name; catalog and registry tables by the document's own name (chip, fabric, graph,
device, coefficient set, rules version), so the same catalog document named by two scenarios
is one set of rows.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pyarrow as pa

from .documents import (
    Chip,
    CoefficientSet,
    Deployment,
    Fabric,
    Graph,
    Node,
    Scenario,
    StorageDevice,
)
from .rules import RulesPack

HEAD_KIND = "__head__"  # reserved layer-kind id under which the graph's head nodes are stored

_I = pa.int64()
_F = pa.float64()
_S = pa.string()
_B = pa.bool_()

SCHEMAS: dict[str, pa.Schema] = {
    "scenarios": pa.schema([
        ("scenario", _S), ("file", _S), ("model", _S), ("model_ref", _S), ("hardware", _S),
        ("fabric", _S), ("nodes", _I), ("gpus_per_node", _I), ("gpus_per_rack", _I),
        ("engine_version", _S), ("rules_version", _S), ("deployment", _S),
        ("pool_count", _I), ("pd_connector", _S), ("offload_connector", _S),
        ("offload_spec", _S), ("offload_eviction_policy", _S), ("offload_prefetch_depth", _I),
        ("workload_shape", _S),
    ]),
    "scenario_coefficient_sets": pa.schema([("scenario", _S), ("position", _I), ("set", _S)]),
    # how the scenario was opened (Repos options), not a document field
    "scenario_options": pa.schema([("scenario", _S), ("assumed_collective_widths", _B)]),
    "scenario_storage": pa.schema([("scenario", _S), ("position", _I), ("tier", _S)]),
    "offload_tiers": pa.schema([("scenario", _S), ("position", _I), ("tier", _S),
                                ("bytes", _I)]),
    "pools": pa.schema([
        ("scenario", _S), ("pool", _I), ("role", _S), ("nodes", _I),
        ("tp", _I), ("pp", _I), ("dp", _I), ("dp_local", _I), ("pcp", _I), ("dcp", _I),
        ("enable_expert_parallel", _B),
        ("all2all_backend", _S), ("disable_custom_all_reduce", _B), ("allreduce_backend", _S),
        ("dbo_enable", _B), ("dbo_decode_token_threshold", _I),
        ("dbo_prefill_token_threshold", _I),
        ("block_size", _I), ("max_num_batched_tokens", _I), ("max_num_seqs", _I),
        ("max_model_len", _I), ("gpu_memory_utilization", _F), ("scheduling_policy", _S),
        ("async_scheduling", _B), ("cudagraph_mode", _S),
        ("max_cudagraph_capture_size", _I), ("cudagraph_capture_sizes", pa.list_(_I)),
        ("quantization", _S), ("cache_dtype", _S), ("enable_prefix_caching", _B),
        ("mamba_cache_dtype", _S), ("mamba_ssm_cache_dtype", _S), ("mamba_cache_mode", _S),
        ("disable_cascade_attn", _B), ("speculative_method", _S), ("num_spec_tokens", _I),
        ("eplb_enable", _B), ("eplb_num_redundant_experts", _I), ("eplb_window_size", _I),
        ("eplb_step_interval", _I), ("dcp_comm_backend", _S), ("dcp_q_replicate", _B),
        ("cp_kv_cache_interleave_size", _I),
    ]),
    "models": pa.schema([
        ("model", _S), ("hidden_size", _I), ("vocab_size", _I), ("tie_word_embeddings", _B),
        ("weight_dtype", _S), ("modality", _S), ("derived_format", _S),
        ("layer_kind_count", _I), ("has_speculator", _B),
    ]),
    "graph_layer_kinds": pa.schema([("model", _S), ("layer_kind", _S), ("kind_position", _I),
                                    ("node_count", _I)]),
    "graph_nodes": pa.schema([
        ("model", _S), ("layer_kind", _S), ("kind_position", _I), ("node_index", _I),
        ("op", _S), ("role", _S), ("emit", _S), ("n", _I), ("k", _I), ("weight_dtype", _S),
        ("experts", _I), ("top_k", _I), ("shared_experts", _I),
        ("shared_intermediate_size", _I), ("latent_size", _I), ("kind", _S), ("n_q", _I),
        ("n_kv", _I), ("d_h", _I), ("kv_lora_rank", _I), ("qk_rope_head_dim", _I),
        ("window", _I), ("index_topk", _I), ("compress_ratio", _I), ("recurrent_kind", _S),
        ("n_heads", _I), ("state_size", _I), ("n_groups", _I), ("conv_kernel", _I),
        ("intermediate_size", _I), ("state_dtype", _S), ("bytes_per_token", _I),
    ]),
    "graph_stack": pa.schema([("model", _S), ("position", _I), ("layer_kind", _S),
                              ("section", _S)]),
    "chips": pa.schema([
        ("chip", _S), ("provenance", _S), ("tflops_bf16", _F), ("tflops_fp8", _F),
        ("tflops_nvfp4", _F), ("bw_peak_tbs", _F), ("memory_gib", _F),
        ("intra_node_bw_gbps", _F), ("sm_count", _I), ("gpus_per_node", _I),
        ("gpus_per_rack", _I), ("intra_rack_bw_gbps", _F),
    ]),
    "fabrics": pa.schema([("fabric", _S), ("provenance", _S), ("inter_node_bw_gbps", _F),
                          ("rdma", _B)]),
    "storage_devices": pa.schema([("device", _S), ("read_bandwidth_mb_s", _F),
                                  ("write_bandwidth_mb_s", _F), ("base_latency_us", _F)]),
    "coefficients": pa.schema([
        ("set", _S), ("entry_index", _I), ("name", _S), ("value", _F), ("units", _S),
        ("method", _S), ("fitted", _B), ("scope_hardware", pa.list_(_S)),
        ("scope_model", pa.list_(_S)), ("scope_tp", pa.list_(_I)), ("scope_ep", pa.list_(_I)),
        ("scope_nodes_spanned", pa.list_(_I)), ("scope_text", _S), ("ci95_low", _F),
        ("ci95_high", _F), ("sources", _S), ("rationale", _S), ("copied_from", _S),
        ("supersedes", _S),
    ]),
    "rules": pa.schema([("version", _S), ("category", _S), ("position", _I), ("value", _S)]),
}

# The key columns that identify one document's rows in each table (for dedupe/conflicts).
DOCUMENT_KEYS: dict[str, str] = {
    "scenarios": "scenario", "scenario_coefficient_sets": "scenario",
    "scenario_options": "scenario",
    "scenario_storage": "scenario", "offload_tiers": "scenario", "pools": "scenario",
    "models": "model", "graph_layer_kinds": "model", "graph_nodes": "model",
    "graph_stack": "model", "chips": "chip", "fabrics": "fabric",
    "storage_devices": "device", "coefficients": "set", "rules": "version",
}


def _table(name: str, rows: list[dict[str, Any]]) -> pa.Table:
    schema = SCHEMAS[name]
    return pa.Table.from_pylist(rows, schema=schema)


def scenario_tables(key: str, file: str, scen: Scenario, dep: Deployment, graph: Graph,
                    rules: RulesPack, *, assumed_collective_widths: bool = True
                    ) -> dict[str, pa.Table]:
    """The scenario-level tables for one scenario (named ``key``)."""
    off = dep.offload
    rows = [{
        "scenario": key, "file": file, "model": graph.name, "model_ref": scen.model,
        "hardware": scen.cluster.hardware, "fabric": scen.cluster.fabric or None,
        "nodes": scen.cluster.nodes, "gpus_per_node": scen.cluster.gpus_per_node,
        "gpus_per_rack": scen.cluster.gpus_per_rack, "engine_version": scen.engine_version,
        "rules_version": rules.version, "deployment": dep.name, "pool_count": len(dep.pools),
        "pd_connector": dep.pd_transfer.connector if dep.pd_transfer else "",
        "offload_connector": off.connector if off else "",
        "offload_spec": off.spec if off else "",
        "offload_eviction_policy": off.eviction_policy if off else "",
        "offload_prefetch_depth": off.prefetch_depth if off else 0,
        "workload_shape": scen.workload.shape if scen.workload else "",
    }]
    sets = [{"scenario": key, "position": i, "set": s} for i, s in enumerate(scen.coefficients)]
    storage = [{"scenario": key, "position": i, "tier": t}
               for i, t in enumerate(scen.cluster.storage)]
    tiers = [{"scenario": key, "position": i, "tier": t.tier, "bytes": t.bytes}
             for i, t in enumerate(off.tiers)] if off else []
    pools = []
    for i, p in enumerate(dep.pools):
        e, par = p.engine, p.parallel
        pools.append({
            "scenario": key, "pool": i, "role": p.role, "nodes": p.nodes,
            "tp": par.tp, "pp": par.pp, "dp": par.dp, "dp_local": par.dp_local,
            "pcp": par.pcp, "dcp": par.dcp, "enable_expert_parallel": par.enable_expert_parallel,
            "all2all_backend": e.all2all_backend,
            "disable_custom_all_reduce": e.disable_custom_all_reduce,
            "allreduce_backend": e.allreduce_backend,
            "dbo_enable": e.dbo.enable_dbo if e.dbo else None,
            "dbo_decode_token_threshold": e.dbo.dbo_decode_token_threshold if e.dbo else 0,
            "dbo_prefill_token_threshold": e.dbo.dbo_prefill_token_threshold if e.dbo else 0,
            "block_size": e.block_size, "max_num_batched_tokens": e.max_num_batched_tokens,
            "max_num_seqs": e.max_num_seqs, "max_model_len": e.max_model_len,
            "gpu_memory_utilization": e.gpu_memory_utilization,
            "scheduling_policy": e.scheduling_policy, "async_scheduling": e.async_scheduling,
            "cudagraph_mode": e.cudagraph_mode,
            "max_cudagraph_capture_size": e.max_cudagraph_capture_size,
            "cudagraph_capture_sizes": (list(e.cudagraph_capture_sizes)
                                        if e.cudagraph_capture_sizes is not None else None),
            "quantization": e.quantization, "cache_dtype": e.cache_dtype,
            "enable_prefix_caching": e.enable_prefix_caching,
            "mamba_cache_dtype": e.mamba_cache_dtype,
            "mamba_ssm_cache_dtype": e.mamba_ssm_cache_dtype,
            "mamba_cache_mode": e.mamba_cache_mode,
            "disable_cascade_attn": e.disable_cascade_attn,
            "speculative_method": e.speculative.method if e.speculative else "",
            "num_spec_tokens": e.speculative.num_spec_tokens if e.speculative else 0,
            "eplb_enable": e.eplb.enable_eplb if e.eplb else False,
            "eplb_num_redundant_experts": e.eplb.num_redundant_experts if e.eplb else 0,
            "eplb_window_size": e.eplb.window_size if e.eplb else 0,
            "eplb_step_interval": e.eplb.step_interval if e.eplb else 0,
            "dcp_comm_backend": e.dcp_comm_backend, "dcp_q_replicate": e.dcp_q_replicate,
            "cp_kv_cache_interleave_size": e.cp_kv_cache_interleave_size,
        })
    return {
        "scenarios": _table("scenarios", rows),
        "scenario_coefficient_sets": _table("scenario_coefficient_sets", sets),
        "scenario_storage": _table("scenario_storage", storage),
        "offload_tiers": _table("offload_tiers", tiers),
        "pools": _table("pools", pools),
        "scenario_options": _table("scenario_options", [
            {"scenario": key, "assumed_collective_widths": assumed_collective_widths}]),
    }


_NODE_FIELDS = [f.name for f in fields(Node)]


def _node_row(model: str, kind: str, kind_pos: int, idx: int, node: Node) -> dict[str, Any]:
    row: dict[str, Any] = {"model": model, "layer_kind": kind, "kind_position": kind_pos,
                           "node_index": idx}
    for name in _NODE_FIELDS:
        row[name] = getattr(node, name)
    return row


def graph_tables(graph: Graph) -> dict[str, pa.Table]:
    """models, graph_layer_kinds, graph_nodes (head under ``__head__``), graph_stack."""
    g = graph.global_
    models = [{
        "model": graph.name, "hidden_size": g.hidden_size, "vocab_size": g.vocab_size,
        "tie_word_embeddings": g.tie_word_embeddings, "weight_dtype": g.weight_dtype,
        "modality": graph.modality, "derived_format": graph.derived_from.format,
        "layer_kind_count": len(graph.layer_kinds), "has_speculator": graph.speculator is not None,
    }]
    kinds: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    for pos, lk in enumerate(graph.layer_kinds):
        kinds.append({"model": graph.name, "layer_kind": lk.id, "kind_position": pos,
                      "node_count": len(lk.nodes)})
        nodes.extend(_node_row(graph.name, lk.id, pos, i, n) for i, n in enumerate(lk.nodes))
    head_pos = len(graph.layer_kinds)
    kinds.append({"model": graph.name, "layer_kind": HEAD_KIND, "kind_position": head_pos,
                  "node_count": len(graph.head)})
    nodes.extend(_node_row(graph.name, HEAD_KIND, head_pos, i, n)
                 for i, n in enumerate(graph.head))
    stack = []
    st = graph.stack
    sections = ([("prologue", k) for k in st.prologue]
                + [("pattern", k) for _ in range(max(st.repeat, 0)) for k in st.pattern]
                + [("epilogue", k) for k in st.epilogue])
    for i, (section, k) in enumerate(sections):
        stack.append({"model": graph.name, "position": i, "layer_kind": k, "section": section})
    return {
        "models": _table("models", models),
        "graph_layer_kinds": _table("graph_layer_kinds", kinds),
        "graph_nodes": _table("graph_nodes", nodes),
        "graph_stack": _table("graph_stack", stack),
    }


def chip_table(chip: Chip) -> pa.Table:
    return _table("chips", [{
        "chip": chip.name, "provenance": chip.provenance, "tflops_bf16": chip.tflops_peak,
        "tflops_fp8": chip.tflops_fp8, "tflops_nvfp4": chip.tflops_nvfp4,
        "bw_peak_tbs": chip.bw_peak_tbs, "memory_gib": chip.memory_gib,
        "intra_node_bw_gbps": chip.intra_node_bw_gbps, "sm_count": chip.sm_count,
        "gpus_per_node": chip.gpus_per_node, "gpus_per_rack": chip.gpus_per_rack,
        "intra_rack_bw_gbps": chip.intra_rack_bw_gbps}])


def fabric_table(fabric: Fabric) -> pa.Table:
    return _table("fabrics", [{"fabric": fabric.name, "provenance": fabric.provenance,
                               "inter_node_bw_gbps": fabric.inter_node_bw_gbps,
                               "rdma": fabric.rdma}])


def device_table(devices: tuple[StorageDevice, ...]) -> pa.Table:
    return _table("storage_devices", [{
        "device": d.name, "read_bandwidth_mb_s": d.read_bandwidth_mb_s,
        "write_bandwidth_mb_s": d.write_bandwidth_mb_s, "base_latency_us": d.base_latency_us}
        for d in devices if d is not None])


def coefficient_table(cset: CoefficientSet) -> pa.Table:
    rows = []
    for i, e in enumerate(cset.coefficients):
        s = e.scope
        ci = e.ci95 or (None, None)
        rows.append({
            "set": cset.name, "entry_index": i, "name": e.name, "value": e.value,
            "units": e.units, "method": e.method, "fitted": e.fitted,
            "scope_hardware": list(s.hardware), "scope_model": list(s.model),
            "scope_tp": list(s.tp), "scope_ep": list(s.ep),
            "scope_nodes_spanned": list(s.nodes_spanned), "scope_text": s.describe(),
            "ci95_low": ci[0], "ci95_high": ci[1],
            "sources": json.dumps([{"kind": x.kind, "cite": x.cite, "role": x.role}
                                   for x in e.sources]) if e.sources else None,
            "rationale": e.rationale, "copied_from": e.copied_from, "supersedes": e.supersedes,
        })
    return _table("coefficients", rows)


def rules_table(pack: RulesPack) -> pa.Table:
    rows: list[dict[str, Any]] = []
    for f in fields(pack):
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
