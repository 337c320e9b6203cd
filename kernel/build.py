"""Construction: documents → DuckDB → ``sql/`` views → one frozen :class:`ResolvedPool`.

``new(inputs)`` registers the documents in a database (a fresh in-memory one unless a
connection is given), runs every view, raises :class:`RefusalError` for the first refusal row
of the pool (the order of the Go constructor, kernel-algorithm.md §1.2), and reads the
resolved rows into the frozen record pricing reads. Nothing in the returned kernel refers to
``inputs`` or the database, so later changes to either do not affect it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import duckdb

from pipeline import db, unstated
from pipeline.constants import KERNEL_ASSUMPTION_SET
from pipeline.errors import DocumentError, RefusalError
from pipeline.load import Inputs, Repos, open_inputs

from . import caches as cache_model
from . import sql_laws  # noqa: F401  (installs the cost laws the views call)
from .origins import catalog_origins
from .resolved import (
    Coefficients,
    CollectiveKey,
    Layout,
    MemoryMagnitudes,
    Origin,
    Override,
    Plan,
    PlannedAttention,
    PlannedCollective,
    PlannedGemm,
    PlannedLayer,
    ResolvedPool,
    StorageTier,
)
from .types import Resolution

if TYPE_CHECKING:
    from .kernel import Kernel


__all__ = ["new", "open", "open_pool", "resolve", "refusals"]


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _check_inputs(inputs: Inputs) -> None:
    """Steps 1–4 of §1.2: required documents, pool index, rules, field validation."""
    if (inputs is None or inputs.scenario is None or inputs.deployment is None
            or inputs.model is None or inputs.chip is None):
        raise RefusalError("inputs", None, "a kernel needs a scenario, a deployment, a model "
                           "graph and a chip")
    pools = inputs.deployment.pools
    if not 0 <= inputs.pool_index < len(pools):
        raise RefusalError("pool_index", inputs.pool_index,
                           f"pool index {inputs.pool_index} is outside the deployment's "
                           f"{len(pools)} pool(s)")
    if inputs.rules is None:
        raise RefusalError("engine_version", inputs.scenario.engine_version,
                           f"a kernel needs engine rules for version "
                           f"{inputs.scenario.engine_version!r}")
    try:
        from pipeline import validate
    except ImportError:  # field validation lands separately; absent means not yet available
        return
    # §1.2 step 4: only field-layer problems refuse; rules-layer findings (which the kernel's
    # own resolution reports as refusals with its v0.31.0 reasons) and warnings are ignored.
    validate_bundle = getattr(validate, "validate_bundle", None)
    if validate_bundle is not None:
        report = validate_bundle(inputs)
        errors = [p for p in report.field if p.severity == "error"]
        if errors:
            raise DocumentError(errors)
        return
    require_valid = getattr(validate, "require_valid", None)
    if require_valid is not None:
        require_valid(inputs)


def refusals(con: duckdb.DuckDBPyConnection, scenario: str, pool: int) -> list[dict[str, Any]]:
    """The pool's refusal rows in constructor order (empty when it can be priced)."""
    return _rows(con, "SELECT step, setting, value, reason FROM refusals "
                 "WHERE scenario = ? AND pool = ? ORDER BY step, setting, value",
                 [scenario, pool])


# Resolutions of identical inputs (frozen documents compare by value), most recent last.
# A resolution is a pure function of the inputs, so a repeated open() of one scenario reuses
# it; refusals are not cached (they are recomputed and raised again).
_RESOLVED: dict[Inputs, tuple[ResolvedPool, Resolution]] = {}
_RESOLVED_MAX = 32


def resolve(inputs: Inputs, con: duckdb.DuckDBPyConnection | None = None
            ) -> tuple[ResolvedPool, Resolution]:
    """Resolve one pool without building a kernel (raises :class:`RefusalError`)."""
    if con is None:
        try:
            hit = _RESOLVED.get(inputs)
        except TypeError:  # an unhashable document (a caller-built list): no memo
            return _resolve(inputs, None)
        if hit is not None:
            return hit
        result = _resolve(inputs, None)
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.pop(next(iter(_RESOLVED)))
        _RESOLVED[inputs] = result
        return result
    return _resolve(inputs, con)


def _resolve(inputs: Inputs, con: duckdb.DuckDBPyConnection | None
             ) -> tuple[ResolvedPool, Resolution]:
    _check_inputs(inputs)
    if con is None:
        con = db.open_db(apply=False)
    key = db.register(con, inputs)
    db.apply_views(con)
    pool = inputs.pool_index
    found = refusals(con, key, pool)
    if found:
        first = found[0]
        raise RefusalError(first["setting"], first["value"], first["reason"])
    return _read(con, key, pool, inputs)


def _read(con: duckdb.DuckDBPyConnection, key: str, pool: int, inputs: Inputs
          ) -> tuple[ResolvedPool, Resolution]:
    args = [key, pool]
    rows = _rows(con, "SELECT * FROM resolved_pools WHERE scenario = ? AND pool = ?", args)
    if not rows:  # pragma: no cover - a join lost the pool: a view bug, not a user error
        raise RuntimeError(f"resolution produced no row for {key!r} pool {pool}")
    r = unstated.kernel_row("resolved_pools", rows[0])  # NULL (unstated) -> the kernel's none

    layout = Layout(
        tp=r["tp"], pp=r["pp"], dp=r["dp"], pcp=r["pcp"], dcp=r["dcp"],
        expert_width=r["expert_width"], moe_group_width=r["moe_group_width"],
        gpus_per_node=r["gpus_per_node"], gpus_per_rack=r["gpus_per_rack"],
        nodes_spanned=r["nodes_spanned"], enable_expert_parallel=r["enable_expert_parallel"],
        all2all_backend=r["all2all_backend"], sequence_parallel_moe=r["sequence_parallel_moe"],
        custom_all_reduce=r["custom_all_reduce"], rack_is_one_domain=r["rack_is_one_domain"],
        intra_node_bw_gbps=r["intra_node_bw_gbps"], inter_node_bw_gbps=r["inter_node_bw_gbps"])

    attention_floor_ns = int(r["attention_floor_ns"])
    by_kind: dict[str, tuple[int, float]] = {}
    for kind in ("swa", "mla", "sparse_mla"):
        rate = r[f"attn_rate_{kind}"]
        if rate is not None and rate > 0:
            floor = r[f"attn_floor_{kind}_ns"]
            by_kind[kind] = (int(floor) if floor is not None and floor > 0
                             else attention_floor_ns, float(rate))
    recurrent: dict[str, tuple[int, float]] = {}
    for kind in ("mamba2", "kda", "gdn"):
        floor, rate = r[f"rec_floor_{kind}"], r[f"rec_rate_{kind}"]
        if floor is not None and rate is not None and floor > 0 and rate > 0:
            recurrent[kind] = (int(floor), float(rate))

    coefficients = Coefficients(
        hbm_bps=float(r["hbm_bps"]), peak_flops=float(r["peak_flops"]),
        gemm_suffix=r["gemm_suffix"], eps_max=float(r["eps_max"]), m_half=float(r["m_half"]),
        n_half=float(r["n_half"]), k_half=float(r["k_half"]), shape_aware=r["shape_aware"],
        nvlink_bps=float(r["nvlink_bps"]), nic_bps=float(r["nic_bps"]),
        attention_floor_ns=attention_floor_ns,
        attention_rate_bps=float(r["attention_rate_bps"]), attention_by_kind=by_kind,
        attention_prefill_floor_ns=int(r["attention_prefill_floor_ns"]),
        attention_prefill_scale=float(r["attention_prefill_scale"]), recurrent=recurrent,
        host_link_bps=float(r["host_link_bps"]), moe_imbalance=float(r["moe_imbalance"]),
        host_admission_per_token_ns=int(r["host_admission_per_token_ns"]),
        host_admission_per_request_ns=int(r["host_admission_per_request_ns"]),
        host_output_token_ns=int(r["host_output_token_ns"]),
        host_completion_ns=int(r["host_completion_ns"]),
        host_launch_eager_per_layer_ns=int(r["host_launch_eager_per_layer_ns"]),
        host_launch_per_kernel_ns=int(r["host_launch_per_kernel_ns"]),
        host_replay_graph_per_step_ns=int(r["host_replay_graph_per_step_ns"]))

    collectives = {}
    for c in _rows(con, "SELECT * FROM collective_keys WHERE scenario = ? AND pool = ? "
                   "ORDER BY key_order", args):
        collectives[(c["op"], c["group"])] = CollectiveKey(
            op=c["op"], group=c["group"], width=c["width"], ranks=c["ranks"],
            floor_ns=int(c["floor_ns"]), peak_bps=float(c["peak_bps"]),
            transition_bps=float(c["transition_bps"]), crosses_nodes=c["crosses_nodes"],
            span=float(c["span"]))

    plan = _plan(con, args, r)

    memory = MemoryMagnitudes(
        comm_bytes=int(r["comm_bytes"]), workspace_bytes=int(r["workspace_bytes"]),
        capture_bytes=int(r["capture_bytes"]),
        activation_buffers=float(r["activation_buffers"]),
        activation_floor=float(r["activation_floor"]),
        activation_width=int(r["activation_width"]),
        batched_tokens=int(r["max_num_batched_tokens"]),
        checkpoint_weight_bytes=float(r["checkpoint_bytes"]),
        vocab_size=int(r["vocab_size"]), hidden_size=int(r["hidden_size"]))

    wanted = {d.name for d in inputs.devices if d is not None}
    tiers = {
        t["device"]: StorageTier(name=t["device"], read_bps=t["read_bandwidth_mb_s"] * 1e6,
                                 write_bps=t["write_bandwidth_mb_s"] * 1e6,
                                 latency_s=t["base_latency_us"] * 1e-6)
        for t in _rows(con, "SELECT * FROM storage_devices ORDER BY device", [])
        if t["device"] in wanted}

    provenance = tuple(
        Origin(name=p["name"], set=p["set"], method=p["method"], scope=p["scope"])
        for p in _rows(con, "SELECT name, set, method, scope FROM provenance "
                       "WHERE scenario = ? AND pool = ? ORDER BY position", args)
    ) + catalog_origins(inputs)
    assumptions = tuple(o for o in provenance if o.set == KERNEL_ASSUMPTION_SET)
    overrides = tuple(
        Override(field=o["field"], requested=o["requested"], resolved=o["resolved"],
                 reason=o["reason"])
        for o in _rows(con, "SELECT * FROM pool_overrides WHERE scenario = ? AND pool = ? "
                       "ORDER BY seq", args))

    resolved = ResolvedPool(
        tables=_typed_tables(con, args),
        scenario=key, pool_index=pool, role=r["role"], chip_name=r["chip"],
        chip_sm_count=int(r["chip_sm_count"]), chip_memory_gib=float(r["chip_memory_gib"]),
        chip_nvfp4_tflops=float(r["chip_nvfp4_tflops"]), model_name=r["model"],
        served_dtype=r["served_dtype"], layout=layout, coefficients=coefficients,
        collectives=collectives, plan=plan,
        experts=int(r["experts"]), total_experts=int(r["total_experts"]),
        experts_per_rank=int(r["experts_per_rank"]),
        local_expert_share=float(r["local_expert_share"]),
        expert_tensor_shards=int(r["expert_tensor_shards"]),
        eplb_redundant_experts=int(r["redundant"]),
        kv_bytes_per_token=float(r["kv_bytes_per_token"]), kv_layers=int(r["kv_layers"]),
        dcp_shards_all_kv_layers=bool(r["dcp_shards_all_kv_layers"]),
        cache_bytes=float(r["cache_bytes"]), cache_layout=r["cache_layout"],
        state_bytes=float(r["state_bytes"]),
        block_size=int(r["block_size"]), block_size_final=bool(r["block_size_final"]),
        max_model_len=int(r["max_model_len"]),
        max_num_batched_tokens=int(r["max_num_batched_tokens"]),
        max_num_seqs=int(r["max_num_seqs"]), num_spec_tokens=int(r["num_spec_tokens"]),
        uniform_decode_width=int(r["uniform_decode_width"]),
        decode_graph_mode=r["decode_graph_mode"], other_graph_mode=r["other_graph_mode"],
        cudagraph_mode=r["cudagraph_mode"], capture_tokens=int(r["capture_tokens"]),
        recurrent_cache_mode=r["recurrent_cache_mode"],
        dcp_comm_backend=r["dcp_comm_backend"], dcp_interleave=int(r["dcp_interleave"]),
        mla_context_chunk=int(r["mla_context_chunk"]),
        async_scheduling=bool(r["async_scheduling"]),
        cascade_attention=bool(r["cascade_attention"]), memory=memory, tiers=tiers,
        provenance=provenance, overrides=overrides, assumptions=assumptions,
        chip_hbm_peak_bps=float(r["chip_hbm_peak_bps"]))
    if inputs.stated_caches:
        resolved = replace(resolved, caches=cache_model.state_caches(
            plan, resolved.kv_bytes_per_token, resolved.kv_layers, resolved.block_size,
            resolved.recurrent_cache_mode, layout.tp, resolved.cache_bytes))

    resolution = Resolution(
        tensor_parallel_width=max(layout.tp, 1), data_parallel_width=max(layout.dp, 1),
        expert_parallel_width=max(layout.expert_width, 1),
        all_reduce_backend="custom" if layout.custom_all_reduce else "nccl",
        async_scheduling=resolved.async_scheduling,
        cascade_attention=resolved.cascade_attention,
        sequence_parallel_moe=layout.sequence_parallel_moe, overrides=overrides)
    return resolved, resolution


def _typed_tables(con: duckdb.DuckDBPyConnection, args: list[Any]) -> dict[str, Any]:
    """The pool's typed provenance and resolved row as Arrow tables (kept on the kernel for
    ``provenance_frame()`` / ``resolved_frame()``; pricing never reads them)."""
    def table(sql: str) -> Any:
        return con.sql(sql, params=args).to_arrow_table()

    return {
        "provenance": table("SELECT * EXCLUDE (scenario, pool) FROM provenance "
                            "WHERE scenario = ? AND pool = ? ORDER BY position"),
        "resolved": table("SELECT * FROM resolved_pools WHERE scenario = ? AND pool = ?"),
        "overrides": table("SELECT * EXCLUDE (scenario, pool) FROM pool_overrides "
                           "WHERE scenario = ? AND pool = ? ORDER BY seq"),
    }


def _plan(con: duckdb.DuckDBPyConnection, args: list[Any], r: dict[str, Any]) -> Plan:
    gemms: dict[str, list[PlannedGemm]] = {}
    for g in _rows(con, "SELECT * FROM plan_gemms WHERE scenario = ? AND pool = ? "
                   "ORDER BY layer_kind, gemm_index", args):
        gemms.setdefault(g["layer_kind"], []).append(PlannedGemm(
            n=int(g["n"]), k=int(g["k"]), flops_per_token=float(g["flops_per_token"]),
            shard_n=bool(g["shard_n"])))
    attentions: dict[str, list[PlannedAttention]] = {}
    for a in _rows(con, "SELECT * FROM plan_attentions WHERE scenario = ? AND pool = ? "
                   "ORDER BY layer_kind, attention_index", args):
        attentions.setdefault(a["layer_kind"], []).append(PlannedAttention(
            q_heads=a["q_heads"], kv_heads=a["kv_heads"], head_dim=a["head_dim"],
            kind=a["kind"], window=a["window"], role=a["role"],
            compress_ratio=a["compress_ratio"]))
    collectives: dict[str, list[PlannedCollective]] = {}
    for c in _rows(con, "SELECT * FROM plan_collectives WHERE scenario = ? AND pool = ? "
                   "ORDER BY layer_kind, collective_index", args):
        collectives.setdefault(c["layer_kind"], []).append(PlannedCollective(
            op=c["op"], group=c["group"], bytes_per_token=float(c["bytes_per_token"]),
            routed_by_top_k=bool(c["routed_by_top_k"])))
    layers: list[PlannedLayer] = []
    head: PlannedLayer | None = None
    for p in _rows(con, "SELECT * FROM plan_layers WHERE scenario = ? AND pool = ? "
                   "ORDER BY position", args):
        kind = p["layer_kind"]
        layer = PlannedLayer(
            kind_id=kind, count=int(p["count"]), dense_gemms=tuple(gemms.get(kind, ())),
            dense_flops_per_token=float(p["dense_flops_per_token"]),
            dense_weight_bytes=float(p["dense_weight_bytes"]),
            expert_flops_per_token_per_expert=float(p["expert_flops_per_token_per_expert"]),
            expert_weight_bytes_per_expert=float(p["expert_weight_bytes_per_expert"]),
            top_k=int(p["top_k"]),
            shared_expert_flops_per_token=float(p["shared_expert_flops_per_token"]),
            shared_expert_weight_bytes=float(p["shared_expert_weight_bytes"]),
            attn_q_heads=int(p["attn_q_heads"]), attn_kv_heads=int(p["attn_kv_heads"]),
            attn_head_dim=int(p["attn_head_dim"]), attn_kind=p["attn_kind"],
            attn_window=int(p["attn_window"]), attn_index_top_k=int(p["attn_index_top_k"]),
            attn_compress_ratio=int(p["attn_compress_ratio"]),
            attn_kv_lora_rank=int(p["attn_kv_lora_rank"]),
            attentions=tuple(attentions.get(kind, ())),
            elementwise_bytes_per_token=float(p["elementwise_bytes_per_token"]),
            recurrent_kind=p["recurrent_kind"],
            recurrent_state_bytes=float(p["recurrent_state_bytes"]),
            collectives=tuple(collectives.get(kind, ())), kernels=int(p["kernels"]))
        if p["is_head"]:
            head = layer
        else:
            layers.append(layer)
    if head is None:  # pragma: no cover - plan_layers always has a head row
        head = PlannedLayer(kind_id="__head__", count=1)
    return Plan(layers=tuple(layers), head=head, total_layers=int(r["total_layers"]),
                total_kernels=int(r["total_kernels"]),
                piecewise_segments=int(r["piecewise_segments"]))


def new(inputs: Inputs, con: duckdb.DuckDBPyConnection | None = None) -> Kernel:
    """Validate, resolve and precompute one pool (kernel-behaviour.md §2.1 ``New``)."""
    from .kernel import Kernel  # pricing modules load only when a kernel is built
    from .stamp import document_digests

    resolved, resolution = resolve(inputs, con)
    return Kernel(resolved, copy.deepcopy(inputs.pool), resolution, document_digests(inputs))


def open(scenario: str | os.PathLike[str], repos: Repos | None = None,  # noqa: A001
         pool: int = 0, *, calibration: Any = None, force_calibration: bool = False) -> Kernel:
    """Load a scenario and everything it names, and build a kernel for its first pool (or
    for pool ``pool``: ``open(s, repos, i)`` is ``open_pool(s, repos, i)``).

    ``calibration`` (a path, a document or a ``Calibration``) adds the calibrated estimate;
    one made for another model or chip is refused unless ``force_calibration``."""
    k = new(open_inputs(scenario, repos, pool))
    if calibration is not None:
        k = k.with_calibration(calibration, force_calibration)
    return k


def open_pool(scenario: str | os.PathLike[str], repos: Repos | None, i: int) -> Kernel:
    """The same for pool ``i`` of a disaggregated deployment."""
    return new(open_inputs(scenario, repos, i))
