"""Strict decoding: every current-schema reference file decodes (and field-validates), legacy
formats fail loudly naming the stale key, and yaml.v3 scalar rules hold."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipeline.decode import decode, decode_map
from pipeline.documents import (
    Chip,
    CoefficientSet,
    Deployment,
    Engine,
    Fabric,
    Graph,
    ModelIdentity,
    Scenario,
    StorageDevice,
)
from pipeline.errors import DocumentError, Problem
from pipeline.load import load_bundle, load_document
from pipeline.validate import (
    validate_chip,
    validate_coefficient_set,
    validate_deployment,
    validate_graph,
    validate_scenario,
    validate_storage,
)
from pipeline.yamlio import read_documents
from tests.validation_support import REFERENCE

REF = REFERENCE
CATALOG, REGISTRY, SCENARIOS = REF / "catalog", REF / "registry", REF / "scenarios"

CHIPS = sorted((CATALOG / "hardware").glob("*.yaml"))
GRAPHS = sorted((CATALOG / "models").glob("*/graph*.yaml"))
SETS = sorted((REGISTRY / "coefficients").glob("*.yaml"))
CURRENT_STORAGE = [CATALOG / "devices" / "storage.yaml",
                   CATALOG / "devices" / "storage.five-classes.reconstructed.yaml"]
LEGACY_STORAGE = [CATALOG / "devices" / "storage.pre-v0.2-five-classes.yaml",
                  CATALOG / "devices" / "storage-legacy-fields.yaml"]
# Fabric classes that still carry PDTransferBaseLatencyMs, which the v0.2 schema removed.
LEGACY_FABRICS = [CATALOG / "networks" / f"{n}.yaml"
                  for n in ("ib-400g", "roce-200g", "ethernet-100gbe")]
OLD_FABRICS = sorted(set((CATALOG / "networks").glob("*.yaml")) - set(LEGACY_FABRICS))
BUNDLES = sorted((SCENARIOS / "kernel-testdata").rglob("*.yaml"))


def test_the_reference_tree_is_there() -> None:
    assert len(CHIPS) == 9 and len(GRAPHS) >= 14 and len(SETS) >= 8 and len(BUNDLES) >= 14


@pytest.mark.parametrize("path", CHIPS, ids=lambda p: p.stem)
def test_reference_chip_decodes_and_validates(path: Path) -> None:
    chip, loaded = load_document(Chip, path)
    assert chip.tflops_peak > 0 and chip.sm_count > 0
    assert validate_chip(chip, str(path), loaded.lines) == []


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.parent.name + "/" + p.name)
def test_reference_graph_decodes_and_validates(path: Path) -> None:
    graph, loaded = load_document(Graph, path)
    assert graph.name == path.parent.name
    assert [p for p in validate_graph(graph, str(path), loaded.lines)
            if p.severity == "error"] == []


@pytest.mark.parametrize("path", SETS, ids=lambda p: p.stem)
def test_reference_coefficient_set_decodes_and_validates(path: Path) -> None:
    cset, loaded = load_document(CoefficientSet, path)
    assert cset.coefficients
    assert validate_coefficient_set(cset, str(path), loaded.lines) == []


@pytest.mark.parametrize("path", CURRENT_STORAGE, ids=lambda p: p.name)
def test_reference_storage_decodes_with_yaml12_floats(path: Path) -> None:
    classes, lines = decode_map(StorageDevice, read_documents(path)[0], str(path))
    assert classes["nvme_gen4"].read_bandwidth_mb_s == 7000.0  # written 7.0e3
    assert classes["cpu_dram"].name == "cpu_dram"
    assert validate_storage(classes.values(), str(path), lines) == []


@pytest.mark.parametrize("path", OLD_FABRICS, ids=lambda p: p.stem)
def test_reference_fabric_decodes(path: Path) -> None:
    fabric, _ = load_document(Fabric, path)
    assert fabric.inter_node_bw_gbps > 0


@pytest.mark.parametrize("path", BUNDLES, ids=lambda p: p.stem)
def test_reference_scenario_bundles_decode_and_validate(path: Path) -> None:
    scenario, deployment = load_bundle(path)
    assert scenario.engine_version == "0.29.0"
    assert validate_scenario(scenario, str(path)) == []
    assert [p for p in validate_deployment(deployment, str(path), scenario.cluster)
            if p.severity == "error"] == []


@pytest.mark.parametrize("name", ["scenario", "scenario-disaggregated", "trace-binding"])
def test_schema_example_scenarios_validate(name: str) -> None:
    path = SCENARIOS / "schemas-examples" / f"{name}.yaml"
    scenario, loaded = load_document(Scenario, path)
    assert validate_scenario(scenario, str(path), loaded.lines) == []


def test_schema_example_trace_binding_decodes_every_field() -> None:
    scenario, _ = load_document(Scenario, SCENARIOS / "schemas-examples" / "trace-binding.yaml")
    trace = scenario.workload.trace  # type: ignore[union-attr]
    assert trace is not None and trace.rows == 1048576
    assert trace.header.server is not None and trace.header.server.gpu_memory_utilization == 0.9
    assert trace.header.goodput_slo_targets["critical"].e2e_ms == 30000.0
    assert trace.header.workload_seed is None  # absent, not 0


@pytest.mark.parametrize("name", ["deployment", "deployment-disaggregated"])
def test_schema_example_deployments_validate(name: str) -> None:
    path = SCENARIOS / "schemas-examples" / f"{name}.yaml"
    deployment, loaded = load_document(Deployment, path)
    assert validate_deployment(deployment, str(path), lines=loaded.lines) == []


def test_schema_example_coefficient_set_validates() -> None:
    path = SCENARIOS / "schemas-examples" / "coefficient-set.yaml"
    cset, loaded = load_document(CoefficientSet, path)
    assert validate_coefficient_set(cset, str(path), loaded.lines) == []


# ---------------------------------------------------------------------------------------
# Legacy formats fail loudly


def _load_errors(func, *args) -> list[Problem]:  # type: ignore[no-untyped-def]
    with pytest.raises(DocumentError) as info:
        func(*args)
    return info.value.problems


@pytest.mark.parametrize("path", LEGACY_STORAGE, ids=lambda p: p.name)
def test_pre_v02_storage_fails_naming_read_bandwidth(path: Path) -> None:
    problems = _load_errors(decode_map, StorageDevice, read_documents(path)[0], str(path))
    first = problems[0]
    assert first.file == str(path)
    assert first.path == "nvme_gen4.read_bandwidth"
    assert "unknown key 'read_bandwidth'" in first.message
    assert first.line == 3
    # every stale key of every class is reported, not just the first
    assert len(problems) == 5 * 3


@pytest.mark.parametrize("path", LEGACY_FABRICS, ids=lambda p: p.stem)
def test_fabric_with_removed_key_fails(path: Path) -> None:
    problems = _load_errors(load_document, Fabric, path)
    assert [p.path for p in problems] == ["PDTransferBaseLatencyMs"]


def test_model_identity_with_unlisted_key_fails() -> None:
    path = CATALOG / "models" / "qwen3-14b" / "model.yaml"
    problems = _load_errors(load_document, ModelIdentity, path)
    assert [p.path for p in problems] == ["source.revision_verified"]


# ---------------------------------------------------------------------------------------
# yaml.v3 scalar rules


def _decode(tp: type, text: str):  # type: ignore[no-untyped-def]
    return decode(tp, read_documents("<test>", text)[0], "<test>")[0]


def test_exponent_without_sign_is_a_float() -> None:
    device = _decode(StorageDevice, "read_bandwidth_mb_s: 7.0e3\nwrite_bandwidth_mb_s: 5e3\n")
    assert device.read_bandwidth_mb_s == 7000.0 and device.write_bandwidth_mb_s == 5000.0


@pytest.mark.parametrize(("word", "value"), [("yes", True), ("on", True), ("Y", True),
                                             ("no", False), ("off", False), ("false", False)])
def test_yaml11_words_are_bools(word: str, value: bool) -> None:
    assert _decode(Engine, f"enable_prefix_caching: {word}\n").enable_prefix_caching is value


def test_quoted_bool_is_not_a_bool() -> None:
    problems = _load_errors(_decode, Engine, 'enable_prefix_caching: "yes"\n')
    assert problems[0].path == "enable_prefix_caching"


def test_any_scalar_decodes_into_a_string_field_as_written() -> None:
    scenario = _decode(Scenario, "engine_version: 0.29\nname: 123\n")
    assert scenario.engine_version == "0.29" and scenario.name == "123"


def test_tri_state_absent_differs_from_false() -> None:
    assert _decode(Engine, "{}").disable_cascade_attn is None
    assert _decode(Engine, "disable_cascade_attn: false\n").disable_cascade_attn is False


def test_nan_and_inf_decode_then_fail_validation() -> None:
    chip = _decode(Chip, "Provenance: derived\nTFlopsPeak: .nan\nBwPeakTBs: -.inf\n"
                   "MemoryGiB: 80\nIntraNodeBwGBps: 450\nSMCount: 132\n")
    assert math.isnan(chip.tflops_peak)
    problems = validate_chip(chip, "c.yaml")
    assert [(p.path, p.message) for p in problems] == [
        ("TFlopsPeak", "must be a finite number, got NaN"),
        ("BwPeakTBs", "must be a finite number, got -Inf")]


def test_duplicate_key_is_an_error_with_its_line() -> None:
    problems = _load_errors(read_documents, "d.yaml", "kind: Scenario\nname: a\nname: b\n")
    assert problems[0].path == "name" and problems[0].line == 3
    assert "duplicate key 'name'" in problems[0].message


def test_unknown_keys_are_all_reported_with_their_paths() -> None:
    problems = _load_errors(_decode, Deployment,
                            "kind: Deployment\nname: x\nfoo: 1\npools:\n"
                            "  - {role: colocated, nodes: 1, bar: 2}\n")
    assert sorted(p.path for p in problems) == ["foo", "pools[0].bar"]


def test_comment_keys_are_allowed_only_where_the_schema_says() -> None:
    chip = _decode(Chip, "_comment: x\n_comment_sm: y\nProvenance: derived\n")
    assert chip.provenance == "derived"
    problems = _load_errors(_decode, Chip, "_commentary: x\n")
    assert problems[0].path == "_commentary"
    problems = _load_errors(_decode, Scenario, "_comment: x\n")
    assert problems[0].path == "_comment"


def test_the_shared_reference_is_beside_the_checkout() -> None:
    """Several tests read ../shared/reference; a missing copy must fail, never empty a parametrize."""
    assert (REF / "catalog" / "hardware").is_dir(), f"missing {REF}"
    assert (REF / "registry" / "coefficients").is_dir(), f"missing {REF}"
