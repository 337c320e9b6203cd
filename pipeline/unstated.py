"""Which columns of the views users query may be NULL, and what the kernel reads for NULL.

In SQL, "unstated" (and "does not apply") is NULL, never ``0`` or ``''``. Every column not
declared here is required: the data tests (tests/test_sql_data.py) check it holds a value on
every row of a pool that resolves. For ``resolved_pools`` each optional column also says what
the kernel's dataclasses hold instead (their own "none": 0, 0.0 or ``''``; ``None`` where the
reader takes NULL itself), and ``kernel.pool.build`` reads the row through :func:`kernel_row`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_HOST_NS = ("host_admission_per_token_ns", "host_admission_per_request_ns",
            "host_output_token_ns", "host_completion_ns", "host_launch_eager_per_layer_ns",
            "host_launch_per_kernel_ns", "host_replay_graph_per_step_ns")

# view -> optional column -> the kernel's value for NULL (None: NULL is read as None)
OPTIONAL: dict[str, dict[str, Any]] = {
    "resolved_pools": {
        # unstated in the scenario or the documents it names
        "pcp": 0, "dcp": 0, "all2all_backend": "", "gpus_per_rack": 0,
        "inter_node_bw_gbps": 0.0, "chip_nvfp4_tflops": 0.0, "max_model_len": 0,
        "cache_layout": "",
        # does not apply: no recurrent layers, no DSA sparse-MLA backend
        "recurrent_cache_mode": "", "sparse_mla_backend": None,
        # optional coefficients the scenario's sets do not hold (model.md §9.9)
        "n_half": 0.0, "k_half": 0.0, "attention_floor_ns": 0, "attention_rate_bps": 0.0,
        "attention_prefill_floor_ns": 0, "attention_prefill_scale": 0.0, "host_link_bps": 0.0,
        "attention_per_request_ns": 0, "moe_expert_tp_split": 0.0,
        "moe_fused_floor_ns": 0, "moe_fused_rate_bps": 0.0,
        "moe_fused_efficiency": 0.0,
        **dict.fromkeys(_HOST_NS, 0),
        **{f"attn_rate_{k}": None for k in ("swa", "mla", "sparse_mla")},
        **{f"attn_floor_{k}_ns": None for k in ("swa", "mla", "sparse_mla")},
        **{f"rec_{c}_{k}": None for k in ("mamba2", "kda", "gdn") for c in ("floor", "rate")},
    },
    # a coefficient has no reason; an assumption has no units, and a value only if numeric
    "provenance": {"value": None, "units": None, "reason": None},
    "evidence": {},
    "refusals": {"value": None},
    # stated_* is NULL where the scenario does not state the setting (and the engine's
    # default applies); a connector, backend or refusal only where there is one
    "pool_engine": dict.fromkeys((
        "stated_mamba_cache_mode", "recurrent_cache_mode", "stated_block_size",
        "stated_max_num_batched_tokens", "stated_max_num_seqs", "stated_cudagraph_mode",
        "stated_max_capture_size", "stated_capture_sizes", "async_scheduling",
        "disable_cascade_attn", "piecewise_connector", "piecewise_connector_why")),
    "pool_dcp": dict.fromkeys(("stated_backend", "stated_interleave", "dcp_q_replicate")),
    "pool_dsa_backend": dict.fromkeys(("stated_cache", "backend", "refusal")),
    "pool_overrides": {},
    "pool_assumptions": {},
    "pool_experts": {},
    # absent coefficients have no value, set or method; required ones no fallback reason
    "pool_coefficient_needs": dict.fromkeys(
        ("value", "si_value", "ns_value", "set", "method", "reason")),
    "pool_memory_names": {"value": None},
    # only durations have an integer ns value; units that do not fit lift to nothing
    "coefficients_lifted": dict.fromkeys(("ns_value", "si_unit", "si_value")),
}


def kernel_row(view: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """``row`` of ``view`` with each NULL optional column replaced by the kernel's value."""
    fill = OPTIONAL[view]
    return {k: fill.get(k) if v is None and k in fill else v for k, v in row.items()}
