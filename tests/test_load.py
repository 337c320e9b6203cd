"""Loading: Repos, load_bundle, open_inputs, strict YAML and name resolution."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import kernel
from pipeline.decode import decode
from pipeline.documents import Chip, Scenario, StorageDevice
from pipeline.errors import DocumentError
from pipeline.load import Repos, load_bundle, open_inputs
from pipeline.resources import data_dir
from pipeline.yamlio import read_documents

SCENARIOS = sorted(p.stem for p in (data_dir() / "scenarios").glob("*.yaml"))
DS3 = "deepseek-v3-h200-fp8-sglang-tp8"


def test_embedded_data_is_present() -> None:
    assert DS3 in SCENARIOS
    assert len(SCENARIOS) >= 10
    assert len(list((data_dir() / "catalog" / "hardware").glob("*.yaml"))) == 9


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_embedded_scenario_loads_every_pool(name: str) -> None:
    first = open_inputs(name)
    assert first.scenario.kind == "Scenario" and first.deployment.kind == "Deployment"
    assert first.model.name == first.scenario.model
    assert first.chip.name == first.scenario.cluster.hardware
    assert [c.name for c in first.coefficients] == list(first.scenario.coefficients)
    assert "cost-model-memory" in first.scenario.coefficients
    for i in range(len(first.deployment.pools)):
        assert open_inputs(name, pool=i).pool == first.deployment.pools[i]


def test_name_and_path_resolve_to_the_same_inputs() -> None:
    path = data_dir() / "scenarios" / f"{DS3}.yaml"
    assert open_inputs(DS3) == open_inputs(path) == open_inputs(str(path), Repos())


def test_load_bundle_reads_scenario_then_deployment() -> None:
    scenario, deployment = kernel.load_bundle(data_dir() / "scenarios" / f"{DS3}.yaml")
    assert scenario.model == "deepseek-v3"
    assert deployment.pools[0].parallel.tp == 8
    assert deployment.pools[0].engine.cudagraph_mode == "PIECEWISE"
    assert deployment.pools[0].engine.enable_prefix_caching is None  # absent ≠ false


def test_pool_index_out_of_range_names_the_file() -> None:
    with pytest.raises(DocumentError) as err:
        open_inputs(DS3, pool=3)
    assert "pool index 3 is outside the deployment's 1 pool(s)" in str(err.value)
    assert err.value.file.endswith(f"{DS3}.yaml")


def _copy_scenario(tmp_path: Path, text_edit: tuple[str, str]) -> Path:
    src = (data_dir() / "scenarios" / f"{DS3}.yaml").read_text()
    old, new = text_edit
    assert old in src
    out = tmp_path / "edited.yaml"
    out.write_text(src.replace(old, new, 1))
    return out


@pytest.mark.parametrize(
    ("edit", "path", "reason"),
    [
        (("model: deepseek-v3", "model: no-such-model"), "model", "looked for models/no-such-model"),
        (("hardware: h200", "hardware: h999"), "cluster.hardware", "looked for hardware/h999.yaml"),
        (("cost-model-memory", "cost-model-nothing"), "coefficients[", "cost-model-nothing"),
        (('engine_version: "0.29.0"', 'engine_version: "9.9.9"'), "engine_version",
         "no rules pack for engine version '9.9.9'"),
        (('engine_version: "0.29.0"', "engine_version: 0.29"), "engine_version",
         "no rules pack for engine version '0.29'"),
        (("hardware: h200", "hardware: ../h200"), "cluster.hardware", "not a valid hardware identity"),
    ],
)
def test_names_that_resolve_to_nothing(tmp_path: Path, edit: tuple[str, str], path: str,
                                       reason: str) -> None:
    bundle = _copy_scenario(tmp_path, edit)
    with pytest.raises(DocumentError) as err:
        open_inputs(bundle)
    problem = err.value.problems[0]
    assert problem.file == str(bundle)
    assert problem.path.startswith(path)
    assert reason in problem.message


def test_unknown_and_duplicate_keys_are_errors_with_lines(tmp_path: Path) -> None:
    bundle = _copy_scenario(tmp_path, ("  gpus_per_node: 8", "  gpus_per_node: 8\n  gpus_per_nod: 8"))
    with pytest.raises(DocumentError) as err:
        load_bundle(bundle)
    (problem,) = err.value.problems
    assert problem.path == "cluster.gpus_per_nod"
    assert "unknown key 'gpus_per_nod'" in problem.message and "gpus_per_node" in problem.message
    assert problem.line > 0

    dup = _copy_scenario(tmp_path, ("  gpus_per_node: 8", "  gpus_per_node: 8\n  gpus_per_node: 4"))
    with pytest.raises(DocumentError) as err:
        load_bundle(dup)
    assert "duplicate key 'gpus_per_node'" in str(err.value)


def test_go_yaml_scalar_rules() -> None:
    text = ("a: {read_bandwidth_mb_s: 7.0e3, write_bandwidth_mb_s: 5e3, base_latency_us: 80}\n")
    tree = read_documents("x.yaml", text)[0]
    from pipeline.decode import decode_map

    classes, _ = decode_map(StorageDevice, tree, "x.yaml")
    assert classes["a"].read_bandwidth_mb_s == 7000.0 and classes["a"].write_bandwidth_mb_s == 5000.0

    scen, _ = decode(Scenario, read_documents("s.yaml", "name: 123\nengine_version: 0.29\n")[0],
                     "s.yaml")
    assert scen.name == "123" and scen.engine_version == "0.29"

    with pytest.raises(DocumentError) as err:
        decode(Chip, read_documents("c.yaml", 'SMCount: "132"\nBwPeakTBs: fast\n')[0], "c.yaml")
    messages = [p.message for p in err.value.problems]
    assert messages == ['expected an integer, got "132"', "expected a number, got 'fast'"]


def test_repos_roots_default_to_embedded_and_accept_own(tmp_path: Path) -> None:
    assert Repos().catalog_root() == data_dir() / "catalog"
    own = tmp_path / "catalog"
    shutil.copytree(data_dir() / "catalog", own)
    inputs = open_inputs(DS3, Repos(catalog=own))
    assert inputs.sources["chip"].file == str(own / "hardware" / "h200.yaml")
