"""Field validation: every malformed document names its file, key path and reason; warnings
are returned, never raised; every problem is found in one pass."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.documents import EPLB, Cluster, Deployment, Parallelism, Pool
from pipeline.errors import DocumentError
from pipeline.validate import (
    Report,
    check_inputs,
    require_valid,
    validate_deployment,
    validate_documents,
    validate_graph,
)
from pipeline.validate_deployment import split_fits
from tests.validation_support import (
    MALFORMED,
    fixture_graph,
    fixture_inputs,
    header,
    load_and_validate,
    with_pool,
)

CASES = sorted(MALFORMED.glob("*.yaml"))


def test_there_are_at_least_thirty_distinct_malformed_cases() -> None:
    assert len(CASES) >= 30
    described = {header(p)["what"] for p in CASES}  # one bad-input class per file
    assert len(described) == len(CASES) and "" not in described


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_malformed_document_names_file_path_and_reason(case: Path) -> None:
    meta = header(case)
    problems = load_and_validate(case, meta["loader"], int(meta.get("pool", 0)))
    errors = [p for p in problems if p.severity == "error"]
    assert errors, f"{case.name}: expected an error, got none"
    matching = [p for p in errors if p.path == meta["path"] and meta["message"] in p.message]
    assert matching, (f"{case.name}: no error at {meta['path']!r} containing "
                      f"{meta['message']!r}; got:\n" + "\n".join(map(str, errors)))
    problem = matching[0]
    assert problem.file == str(case)
    assert problem.rule == ""
    if problem.path and "pool" not in meta:
        assert problem.line > 0, f"{case.name}: no source line for {problem}"


@pytest.mark.parametrize("name", ["tiny-tp2", "tiny-1p1d"])
def test_fixture_bundles_are_clean_for_every_pool(name: str) -> None:
    inputs = fixture_inputs(name)
    for pool in range(len(inputs.deployment.pools)):
        report = check_inputs(fixture_inputs(name, pool))
        assert report.problems() == []
        assert report.rules_applied == "0.29.0"


def test_every_problem_is_found_in_one_pass() -> None:
    inputs = with_pool(fixture_inputs(), tp=0, block_size=-1, gpu_memory_utilization=1.5,
                       max_num_seqs=-2)
    errors = check_inputs(inputs).errors()
    paths = {p.path for p in errors}
    assert {"deployment.pools[0].parallel.tp", "deployment.pools[0].engine.block_size",
            "deployment.pools[0].engine.gpu_memory_utilization",
            "deployment.pools[0].engine.max_num_seqs"} <= paths


def test_require_valid_raises_every_error_not_just_the_first() -> None:
    inputs = with_pool(fixture_inputs(), tp=0, block_size=-1)
    with pytest.raises(DocumentError) as info:
        require_valid(inputs)
    assert len(info.value.problems) >= 2
    assert all(p.severity == "error" for p in info.value.problems)
    assert "tiny-tp2.yaml" in info.value.file


def test_field_errors_block_the_rule_layer() -> None:
    inputs = with_pool(fixture_inputs(), tp=0, all2all_backend="nope")
    report = check_inputs(inputs)
    assert report.rule == [] and report.rules_applied == ""
    assert not report.ok()


@pytest.mark.parametrize(("changes", "model", "rule", "fragment"), [
    ({"tp": 4, "enable_expert_parallel": True}, "tiny-moe", "expert-imbalance-without-eplb",
     "pools[0]: 6 experts over width 4 leaves 2 ranks with 2 experts and the rest with 1, "
     "a 2.00x static imbalance the estimate must carry"),
    ({}, "tiny-mamba", "mamba-cache-mode-matches-model",
     "pools[0].engine: the model has recurrent layers but no mamba_cache_mode is stated"),
    ({"mamba_cache_mode": "align"}, None, "mamba-cache-mode-matches-model",
     "pools[0].engine.mamba_cache_mode is set but the model has no recurrent layer"),
    ({"quantization": "my_outoftree_quant"}, None, "quantization-known",
     'pools[0].engine.quantization: "my_outoftree_quant" is not an in-tree method of engine '
     "0.29.0; if it is an out-of-tree method this is expected"),
])
def test_rule_warnings_are_returned_not_raised(changes: dict[str, object], model: str | None,
                                               rule: str, fragment: str) -> None:
    inputs = with_pool(fixture_inputs(), model=model, **changes)
    report = require_valid(inputs)  # must not raise
    assert report.ok()
    warnings = [p for p in report.warnings() if p.rule == rule]
    assert len(warnings) == 1, report.problems()
    assert fragment in warnings[0].message
    assert warnings[0].path == ""


def test_field_warnings_are_returned_not_raised() -> None:
    inputs = with_pool(fixture_inputs(), tp=1, enable_expert_parallel=True,
                       disable_custom_all_reduce=False, allreduce_backend="nccl")
    report = require_valid(inputs)
    messages = {p.message for p in report.warnings() if p.path == "deployment"}
    assert ("pools[0].parallel: expert parallelism is enabled but the derived width is 1, so no "
            "expert sharding occurs") in messages
    assert ("pools[0].engine: allreduce_backend names nccl while disable_custom_all_reduce is "
            "false; the engine would use the custom kernel where reachable") in messages


@pytest.mark.parametrize(("changes", "model", "rule", "message"), [
    ({"all2all_backend": "deepep_turbo"}, None, "all2all-backend-known",
     'pools[0].engine.all2all_backend: "deepep_turbo" is not accepted by engine 0.29.0'),
    ({"pcp": 2, "dp": 2, "tp": 2}, None, "pcp-excludes-data-parallelism",
     "pools[0]: pcp 2 with dp 2; engine 0.29.0 refuses prefill-context parallelism combined "
     "with data parallelism"),
])
def test_rule_errors_carry_their_rule_id(changes: dict[str, object], model: str | None,
                                         rule: str, message: str) -> None:
    inputs = with_pool(fixture_inputs(), model=model, **changes)
    if changes.get("pcp"):  # fill the cluster so only the rule fires
        scen = inputs.scenario
        inputs = dataclasses.replace(inputs, scenario=dataclasses.replace(
            scen, cluster=dataclasses.replace(scen.cluster, gpus_per_node=8)))
    report = check_inputs(inputs)
    assert report.field == [] or all(p.severity == "warning" for p in report.field)
    errors = [p for p in report.errors() if p.rule == rule]
    assert [p.message for p in errors] == [message]
    assert str(errors[0]).startswith(f"error [{rule}]: ")
    with pytest.raises(DocumentError):
        require_valid(inputs)


def test_eplb_divisibility_is_a_rule_error() -> None:
    inputs = with_pool(fixture_inputs(), model="tiny-moe", tp=4, enable_expert_parallel=True,
                       eplb=EPLB(enable_eplb=True, num_redundant_experts=1))
    errors = check_inputs(inputs).errors()
    assert [(p.rule, p.message) for p in errors] == [(
        "expert-divisibility-under-eplb",
        "pools[0]: 6 experts plus 1 redundant is 7, which does not divide expert-parallel "
        "width 4; 1 more redundant experts would")]


def test_unknown_engine_version_is_one_warning_and_no_pack() -> None:
    inputs = fixture_inputs()
    scenario = dataclasses.replace(inputs.scenario, engine_version="0.31.0")
    report = validate_documents(scenario=scenario, deployment=inputs.deployment,
                                model=inputs.model, sources=inputs.sources)
    assert report.ok() and report.rules_applied == ""
    assert [(p.rule, p.severity) for p in report.rule] == [("engine-version-known", "warning")]
    assert report.rule[0].message == (
        'no rules pack for engine version "0.31.0"; field validation passed but no '
        "version-specific rule was applied. Registered versions: [0.29.0]")


def test_deployment_without_scenario_is_a_field_problem() -> None:
    report = validate_documents(deployment=fixture_inputs().deployment)
    assert [p.path for p in report.errors()] == ["deployment"]


def test_report_orders_field_then_rule_problems() -> None:
    inputs = with_pool(fixture_inputs(), quantization="x", enable_expert_parallel=True, tp=1)
    report = check_inputs(inputs)
    assert isinstance(report, Report)
    layers = ["rule" if p.rule else "field" for p in report.problems()]
    assert layers == sorted(layers)  # "field" < "rule"
    assert len(report.problems()) == len(report.errors()) + len(report.warnings())


def test_problem_lines_point_into_the_bundle() -> None:
    path = MALFORMED / "tp-zero.yaml"
    problem = next(p for p in load_and_validate(path, "bundle") if p.path.endswith(".tp"))
    line = path.read_text().splitlines()[problem.line - 1]
    assert "tp: 0" in line


# ---------------------------------------------------------------------------------------
# The model.md §12.2 placement algorithm

CLUSTER_2x8 = Cluster(hardware="h100", fabric="ib-400g", nodes=2, gpus_per_node=8)


def _deployment(nodes: int, **parallel: int) -> Deployment:
    return Deployment(kind="Deployment", name="d", pools=(
        Pool(role="colocated", nodes=nodes, parallel=Parallelism(**parallel)),))


def test_local_replica_split_error() -> None:
    problems = validate_deployment(_deployment(2, tp=6, pp=1, dp=2, dp_local=2), "f.yaml",
                                   CLUSTER_2x8)
    assert [(p.path, p.message) for p in problems] == [(
        "pools[0].parallel",
        "no node count up to the pool's 2 lets the engine place 2 local replicas of 6 GPUs "
        "(pp 1 x tp 6 x pcp 1) on a 8-GPU node: replica i starts at device i x 6, so the last "
        "leaves 2 GPUs for its share of the replica, and every split the pool allows (a "
        "divisor of 6 over at most 2 nodes) leaves a larger share")]


def test_placements_that_fit_have_no_problem() -> None:
    for parallel in ({"tp": 8, "pp": 1, "dp": 2, "dp_local": 1},
                     {"tp": 1, "pp": 1, "dp": 16, "dp_local": 8},
                     {"tp": 2, "pp": 1, "dp": 8, "dp_local": 4, "pcp": 1}):
        assert validate_deployment(_deployment(2, **parallel), "f", CLUSTER_2x8) == []


def test_split_search() -> None:
    assert split_fits(6, 2, 2) is False  # needs 3 nodes
    assert split_fits(6, 2, 3) is True
    assert split_fits(8, 8, 1) is True
    assert split_fits(2**41 - 1, 2**21, 3 * 2**20) is None  # the search bound is hit


def test_graph_unused_layer_kind_is_a_warning() -> None:
    graph = fixture_graph("tiny-llm")
    extra = dataclasses.replace(graph.layer_kinds[0], id="spare")
    problems = validate_graph(dataclasses.replace(graph, layer_kinds=(*graph.layer_kinds, extra)),
                              "g.yaml")
    assert [(p.severity, p.path, p.message) for p in problems] == [
        ("warning", "", 'layer kind "spare" is declared but never used by the stack')]


def test_non_collective_emit_is_a_warning() -> None:
    graph = fixture_graph("tiny-llm")
    lk = graph.layer_kinds[0]
    node = dataclasses.replace(lk.nodes[0], emit="tensor_parallel")
    lk = dataclasses.replace(lk, nodes=(node, *lk.nodes[1:]))
    problems = validate_graph(dataclasses.replace(graph, layer_kinds=(lk,)), "g.yaml")
    assert [(p.severity, p.message) for p in problems] == [
        ("warning", "layer_kinds[0].nodes[0]: a condition on a non-collective node encodes "
                    "deployment in the model graph")]


def test_require_valid_can_leave_rule_errors_to_the_caller() -> None:
    inputs = with_pool(fixture_inputs(), all2all_backend="turbo")
    report = require_valid(inputs, rules=False)
    assert [p.rule for p in report.errors()] == ["all2all-backend-known"]
    with pytest.raises(DocumentError):
        require_valid(inputs)
