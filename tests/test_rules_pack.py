"""The rules-pack layer (model.md §12.6): every rule fires with its id, severity and message."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pipeline.documents import DBO, EPLB, Offload, Speculative, Speculator, Stack, Tier
from pipeline.load import Inputs
from pipeline.rulecheck import RULES, RuleContext, check_rules
from pipeline.rules import V0_29
from pipeline.validate import check_inputs
from tests.validation_support import fixture_graph, fixture_inputs, with_pool

SPEC_ORDER = [
    "all2all-backend-known", "allreduce-backend-known", "enum-values-known",
    "speculative-method-known", "dcp-comm-backend-known", "cp-kv-cache-interleave-fits-block",
    "pcp-excludes-data-parallelism", "expert-divisibility-under-eplb",
    "expert-imbalance-without-eplb", "custom-allreduce-reachable", "offload-spec-known",
    "quantization-known", "connector-known", "eviction-policy-known",
    "mamba-cache-mode-matches-model", "cascade-attention-is-opt-in",
    "dbo-thresholds-stated-when-enabled", "sequence-parallel-moe-implied",
]


def test_rules_run_in_pack_order() -> None:
    assert [rule for rule, _ in RULES] == SPEC_ORDER


def _bundle(model: str | None = None, offload: Any = "keep", nodes: int = 1,
            **pool: Any) -> Inputs:
    inputs = with_pool(fixture_inputs(), model=model, **pool)
    dep = inputs.deployment
    if offload != "keep":
        dep = dataclasses.replace(dep, offload=offload)
    if nodes != 1:
        dep = dataclasses.replace(dep, pools=(dataclasses.replace(dep.pools[0], nodes=nodes),))
        cluster = dataclasses.replace(inputs.scenario.cluster, nodes=nodes, fabric="ib-400g")
        inputs = dataclasses.replace(inputs, scenario=dataclasses.replace(
            inputs.scenario, cluster=cluster))
    return dataclasses.replace(inputs, deployment=dep)


def _speculating_graph() -> Any:
    graph = fixture_graph("tiny-llm")
    return dataclasses.replace(graph, speculator=Speculator(
        method="tiny_mtp", num_spec_tokens=1, stack=Stack(pattern=("dense",), repeat=1)))


OFFLOAD = Offload(tiers=(Tier("cpu_dram", 1024),))
CASES: list[tuple[str, dict[str, Any], str, list[str]]] = [
    ("all2all-backend-known", {"all2all_backend": "pplx2"}, "error",
     ['pools[0].engine.all2all_backend: "pplx2" is not accepted by engine 0.29.0']),
    ("allreduce-backend-known", {"allreduce_backend": "quick"}, "error",
     ['pools[0].engine.allreduce_backend: "quick" is not accepted by engine 0.29.0']),
    ("enum-values-known", {"cudagraph_mode": "full", "cache_dtype": "fp8_e4m3fn",
                           "mamba_ssm_cache_dtype": "fp64", "scheduling_policy": "lifo"}, "error",
     ['pools[0].engine.cudagraph_mode: "full" is not accepted by engine 0.29.0',
      'pools[0].engine.cache_dtype: "fp8_e4m3fn" is not accepted by engine 0.29.0',
      'pools[0].engine.mamba_ssm_cache_dtype: "fp64" is not accepted by engine 0.29.0',
      'pools[0].engine.scheduling_policy: "lifo" is not accepted by engine 0.29.0']),
    ("speculative-method-known", {"speculative": Speculative("mtp2", 1)}, "error",
     ['pools[0].engine.speculative.method: "mtp2" is not accepted by engine 0.29.0']),
    ("dcp-comm-backend-known", {"dcp_comm_backend": "nccl"}, "error",
     ['pools[0].engine.dcp_comm_backend "nccl" is not one engine 0.29.0 accepts (a2a, ag_rs)']),
    ("cp-kv-cache-interleave-fits-block",
     {"offload": None, "tp": 4, "dcp": 2, "block_size": 16, "cp_kv_cache_interleave_size": 3},
     "error", ["pools[0].engine: block_size 16 must be at least, and divisible by, "
               "cp_kv_cache_interleave_size 3 when dcp is 2; engine 0.29.0 refuses it at "
               "startup"]),
    ("pcp-excludes-data-parallelism", {"tp": 2, "pcp": 2, "dp": 2}, "error",
     ["pools[0]: pcp 2 with dp 2; engine 0.29.0 refuses prefill-context parallelism combined "
      "with data parallelism"]),
    ("expert-divisibility-under-eplb",
     {"model": "tiny-moe", "tp": 4, "enable_expert_parallel": True,
      "eplb": EPLB(True, 3)}, "error",
     ["pools[0]: 6 experts plus 3 redundant is 9, which does not divide expert-parallel width "
      "4; 3 more redundant experts would"]),
    ("expert-imbalance-without-eplb", {"model": "tiny-moe", "tp": 8,
                                       "enable_expert_parallel": True}, "error",
     ["pools[0]: expert-parallel width 8 exceeds the model's 6 experts, leaving ranks with "
      "none"]),
    # 24 heads: tp 12 must divide the query heads, or validation refuses the pool before any
    # rule runs (decision RL9)
    ("custom-allreduce-reachable", {"allreduce_backend": "custom", "tp": 12, "nodes": 2,
                                    "heads": 24},
     "warning",
     ["pools[0]: tp 12 is not a supported world size for the custom all-reduce, so the engine "
      "will fall back to NCCL and the cost moves from SMs to the NIC",
      "pools[0]: tp 12 spans more than the 8 GPUs in a node, so the custom all-reduce needs "
      "multi-node NVLink on every rank or it falls back to NCCL"]),
    ("offload-spec-known", {"offload": dataclasses.replace(OFFLOAD, spec="GPUOffloadingSpec")},
     "error", ['offload.spec: "GPUOffloadingSpec" is not a registered spec in engine 0.29.0']),
    ("quantization-known", {"quantization": "bitsandbytes4"}, "warning",
     ['pools[0].engine.quantization: "bitsandbytes4" is not an in-tree method of engine '
      "0.29.0; if it is an out-of-tree method this is expected, otherwise check the spelling. "
      "In-tree methods are [" + " ".join(sorted(V0_29.quantizations)) + "]"]),
    ("connector-known", {"offload": dataclasses.replace(OFFLOAD, connector="MyConnector")},
     "warning",
     ['offload.connector: "MyConnector" is not a connector registered in engine 0.29.0; if it '
      "is an out-of-tree connector this is expected, otherwise check the spelling. Registered "
      "connectors are [" + " ".join(sorted(V0_29.connectors)) + "]"]),
    ("eviction-policy-known", {"offload": dataclasses.replace(OFFLOAD, eviction_policy="fifo")},
     "warning",
     ['offload.eviction_policy: "fifo" is not an in-tree policy of engine 0.29.0; if it is an '
      "out-of-tree policy this is expected, otherwise check the spelling. In-tree policies are "
      "[arc lru]"]),
    ("mamba-cache-mode-matches-model", {"model": "tiny-mamba"}, "warning",
     ["pools[0].engine: the model has recurrent layers but no mamba_cache_mode is stated, so "
      "whether their state is fixed or context-proportional is unresolved"]),
    ("cascade-attention-is-opt-in", {"disable_cascade_attn": False,
                                     "speculative": Speculative("eagle", 2)}, "warning",
     ["pools[0]: cascade attention is requested alongside speculative decoding; with async "
      "scheduling resolved on, the engine disables cascade regardless"]),
    ("dbo-thresholds-stated-when-enabled", {"dbo": DBO(enable_dbo=True)}, "warning",
     ["pools[0].engine.dbo: enabled with no thresholds stated; engine 0.29.0 defaults to 32 "
      "for a uniform-decode batch and 512 otherwise"]),
    ("sequence-parallel-moe-implied",
     {"model": "tiny-moe", "tp": 2, "dp": 2, "enable_expert_parallel": True,
      "all2all_backend": "deepep_low_latency", "eplb": None}, "warning",
     ['pools[0]: engine 0.29.0 makes the MoE input sequence-parallel here (backend '
      '"deepep_low_latency", tp 2, dp 2), so the model graph must emit a reduce-scatter and '
      "all-gather pair rather than an all-reduce"]),
]


def test_every_rule_has_a_case() -> None:
    assert sorted({rule for rule, *_ in CASES}) == sorted(SPEC_ORDER)


def _with_heads(graph: Any, heads: int) -> Any:
    """``graph`` with every attention node's query heads set to ``heads``."""
    kinds = tuple(dataclasses.replace(lk, nodes=tuple(
        dataclasses.replace(n, n_q=heads) if n.op == "Attention" else n for n in lk.nodes))
        for lk in graph.layer_kinds)
    return dataclasses.replace(graph, layer_kinds=kinds)


@pytest.mark.parametrize(("rule", "changes", "severity", "messages"), CASES,
                         ids=[c[0] for c in CASES])
def test_rule_fires(rule: str, changes: dict[str, Any], severity: str,
                    messages: list[str]) -> None:
    changes = dict(changes)
    heads = changes.pop("heads", None)
    inputs = _bundle(model=changes.pop("model", None), offload=changes.pop("offload", "keep"),
                     nodes=changes.pop("nodes", 1), **changes)
    if heads is not None:
        inputs = dataclasses.replace(inputs, model=_with_heads(inputs.model, heads))
    report = check_inputs(inputs)
    assert not [p for p in report.field if p.severity == "error"], report.field
    assert report.rules_applied == "0.29.0"
    fired = [p for p in report.rule if p.rule == rule]
    assert sorted(p.message for p in fired) == sorted(messages)
    assert {p.severity for p in fired} == {severity}
    assert all(p.path == "" for p in fired)
    assert all(p.file.endswith("tiny-tp2.yaml") for p in fired)


def test_model_speculator_method_is_checked_against_the_model_file() -> None:
    inputs = dataclasses.replace(fixture_inputs(), model=_speculating_graph())
    fired = [p for p in check_inputs(inputs).rule if p.rule == "speculative-method-known"]
    assert [p.message for p in fired] == [
        'model.speculator.method: "tiny_mtp" is not accepted by engine 0.29.0']


def test_problems_come_out_in_pack_order() -> None:
    inputs = _bundle(all2all_backend="x", quantization="y", dbo=DBO(enable_dbo=True),
                     cudagraph_mode="z")
    ctx = RuleContext(inputs.rules, inputs.scenario, inputs.deployment, inputs.model)
    fired = [p.rule for p in check_rules(ctx)]
    assert fired == ["all2all-backend-known", "enum-values-known", "quantization-known",
                     "dbo-thresholds-stated-when-enabled"]


def test_interleave_rule_is_skipped_with_offload_or_recurrent_model() -> None:
    changes = {"tp": 4, "dcp": 2, "block_size": 16, "cp_kv_cache_interleave_size": 3}
    for inputs in (_bundle(**changes), _bundle(model="tiny-mamba", offload=None,
                                               mamba_cache_mode="align", **changes)):
        rules = {p.rule for p in check_inputs(inputs).rule}
        assert "cp-kv-cache-interleave-fits-block" not in rules


def test_accepted_values_raise_nothing() -> None:
    inputs = _bundle(model="tiny-moe", all2all_backend="deepep_high_throughput",
                     allreduce_backend="custom", cudagraph_mode="FULL_AND_PIECEWISE",
                     cache_dtype="fp8", scheduling_policy="priority", quantization="fp8",
                     dcp_comm_backend="a2a", speculative=Speculative("eagle3", 3))
    assert check_inputs(inputs).rule == []
