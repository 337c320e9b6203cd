"""``blis-kernel validate``: exit codes 0/1/2 and every problem printed, one a line."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner, Result

from kernel.cli import cli
from tests.validation_support import MALFORMED, REFERENCE, ROOTS

ROOT_OPTIONS = ["--scenarios-root", str(ROOTS / "scenarios"), "--catalog", str(ROOTS / "catalog"),
                "--registry", str(ROOTS / "registry")]
PROBLEM_LINE = re.compile(r"^(error|warning)( \[[a-z0-9-]+\])?: \S+?(:\d+)?: \S+: .+$")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["validate", *args])


def problem_lines(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if PROBLEM_LINE.match(line)]


def document_lines(result: Result) -> list[str]:
    """Problem lines of the document layers (field and rules), without the kernel's refusals:
    the fixture roots' tiny bundles carry no cost-model coefficients, so the kernel refuses
    every one of their pools, and validate says so."""
    return [line for line in problem_lines(result) if not line.startswith("error [refusal]")]


def refusal_files(result: Result) -> set[str]:
    return {Path(line.split(": ")[1].split(":")[0]).stem for line in problem_lines(result)
            if line.startswith("error [refusal]")}


def _bundle(tmp_path: Path, deployment_extra: str = "", engine: str = "{}") -> Path:
    text = (ROOTS / "scenarios" / "tiny-tp2.yaml").read_text()
    text = text.replace("engine: {block_size: 16, max_num_seqs: 256, gpu_memory_utilization: 0.9}",
                        f"engine: {engine}")
    path = tmp_path / "bundle.yaml"
    path.write_text(text + deployment_extra)
    return path


def test_fixture_roots_validate_clean() -> None:
    result = run(str(ROOTS))
    assert result.exit_code == 1, result.output
    assert document_lines(result) == []
    assert refusal_files(result) == {"tiny-tp2", "tiny-1p1d"}
    for kind in ("graph", "model identity", "chip", "fabric", "storage", "coefficient set",
                 "scenario bundle"):
        assert kind in result.output
    assert "10 checked, 2 failed" in result.output


def test_no_path_validates_the_configured_roots() -> None:
    result = run(*ROOT_OPTIONS)
    assert result.exit_code == 1, result.output
    assert document_lines(result) == []
    assert refusal_files(result) == {"tiny-tp2", "tiny-1p1d"}


def test_scenario_by_name_under_the_scenarios_root() -> None:
    result = run(*ROOT_OPTIONS, "tiny-1p1d")
    assert result.exit_code == 1, result.output
    assert document_lines(result) == [] and refusal_files(result) == {"tiny-1p1d"}
    assert "1 checked, 1 failed" in result.output


def test_two_bad_keys_print_two_lines_and_exit_1(tmp_path: Path) -> None:
    path = _bundle(tmp_path, engine="{tensor_parallel_size: 2, blok_size: 16}")
    result = run(*ROOT_OPTIONS, str(path))
    assert result.exit_code == 1, result.output
    lines = problem_lines(result)
    assert len(lines) == 2
    assert any("deployment.pools[0].engine.tensor_parallel_size" in line for line in lines)
    assert any("deployment.pools[0].engine.blok_size" in line for line in lines)
    assert all(line.startswith(f"error: {path}:") for line in lines)


def test_every_field_error_is_printed(tmp_path: Path) -> None:
    path = _bundle(tmp_path, engine="{block_size: -1, max_num_seqs: -1, gpu_memory_utilization: 2}")
    result = run(*ROOT_OPTIONS, str(path))
    assert result.exit_code == 1
    assert len(problem_lines(result)) == 3
    assert "1 failed: 3 error(s)" in result.output


def test_warnings_alone_exit_0() -> None:
    """An embedded scenario the kernel builds, with one rule warning: exit 0."""
    from pipeline.resources import data_dir

    result = run(str(data_dir() / "scenarios" / "kimi-k3-h100-nospec.yaml"))
    assert result.exit_code == 0, result.output
    [line] = problem_lines(result)
    assert line.startswith("warning [mamba-cache-mode-matches-model]: ")


def test_rule_error_exits_1_with_its_rule_id(tmp_path: Path) -> None:
    path = _bundle(tmp_path, engine="{all2all_backend: turbo}")
    result = run(*ROOT_OPTIONS, str(path))
    assert result.exit_code == 1
    [line] = problem_lines(result)
    assert line.startswith("error [all2all-backend-known]: ")
    assert 'pools[0].engine.all2all_backend: "turbo" is not accepted by engine 0.29.0' in line


def test_unresolved_names_are_all_reported(tmp_path: Path) -> None:
    text = (ROOTS / "scenarios" / "tiny-tp2.yaml").read_text()
    text = text.replace("model: tiny-llm", "model: nope").replace("[tiny]", "[tiny, gone]")
    path = tmp_path / "refs.yaml"
    path.write_text(text)
    result = run(*ROOT_OPTIONS, str(path))
    assert result.exit_code == 1
    lines = problem_lines(result)
    assert any(": references.model: " in line for line in lines)
    assert any(": references.coefficients[1]: " in line and '"gone": looked for '
               "coefficients/gone.yaml; the registry has [tiny]" in line for line in lines)


def test_unknown_engine_version_is_a_warning_and_a_refusal(tmp_path: Path) -> None:
    """Document validation warns (model.md §12.6); opening the bundle fails with no rules pack, so
    the bundle check reports that as an error too (validate agrees with open)."""
    text = (ROOTS / "scenarios" / "tiny-tp2.yaml").read_text().replace('"0.29.0"', "0.29")
    path = tmp_path / "v.yaml"
    path.write_text(text)
    result = run(*ROOT_OPTIONS, str(path))
    assert result.exit_code == 1, result.output
    warning, error = problem_lines(result)
    assert warning.startswith("warning [engine-version-known]: ")
    assert 'no rules pack for engine version "0.29"' in warning
    assert error.startswith("error [refusal]: ") and "no rules pack" in error


def test_single_documents_are_detected() -> None:
    for name, kind in (("nan-chip.yaml", "chip"), ("graph-cycle.yaml", "graph"),
                       ("unknown-key-storage-class.yaml", "storage"),
                       ("ci95-excludes-value.yaml", "coefficient set")):
        result = run(str(MALFORMED / name))
        assert result.exit_code == 1, (name, result.output)
        assert kind in result.output
        assert problem_lines(result), name


def test_legacy_storage_fails_naming_the_key() -> None:
    path = REFERENCE / "catalog" / "devices" / "storage.pre-v0.2-five-classes.yaml"
    result = run(str(path))
    assert result.exit_code == 1
    assert len(problem_lines(result)) == 15
    assert "nvme_gen4.read_bandwidth: unknown key 'read_bandwidth'" in result.output


def test_reference_registry_root_validates() -> None:
    result = run(str(REFERENCE / "registry"))
    assert result.exit_code == 0, result.output
    assert "cost-model-collectives" in result.output


def test_catalog_root_reports_graph_name_mismatch(tmp_path: Path) -> None:
    model = tmp_path / "models" / "renamed"
    model.mkdir(parents=True)
    (model / "graph.yaml").write_text(
        (ROOTS / "catalog" / "models" / "tiny-llm" / "graph.yaml").read_text())
    result = run(str(tmp_path))
    assert result.exit_code == 1
    assert 'name: must equal the model directory "renamed", got "tiny-llm"' in result.output


def test_several_paths_in_one_run() -> None:
    result = run(str(MALFORMED / "tp-zero.yaml"), str(MALFORMED / "graph-cycle.yaml"),
                 *ROOT_OPTIONS)
    assert result.exit_code == 1
    files = {line.split(": ")[1].split(":")[0] for line in problem_lines(result)}
    assert files == {str(MALFORMED / "tp-zero.yaml"), str(MALFORMED / "graph-cycle.yaml")}


def test_nonexistent_path_exits_2() -> None:
    result = run(*ROOT_OPTIONS, "/no/such/place.yaml")
    assert result.exit_code == 2
    assert "no such file, directory or scenario name" in result.output


def test_empty_directory_exits_2(tmp_path: Path) -> None:
    assert run(str(tmp_path)).exit_code == 2


def test_bad_option_exits_2() -> None:
    assert run("--no-such-option").exit_code == 2


def test_embedded_data_validates() -> None:
    """The embedded catalog, registry and every scenario have no errors (warnings allowed);
    without the assumed collective widths the kernel refuses the 16-wide scenarios, and
    validate reports exactly those, as open does."""
    from tests.embedded import ASSUMED_WIDTHS

    result = run()
    assert result.exit_code == 0, result.output
    assert "failed: 0 error(s)" in result.output
    assert not any(line.startswith("error") for line in problem_lines(result))
    strict = run("--no-assumed-widths")
    assert strict.exit_code == 1, strict.output
    errors = [line for line in problem_lines(strict) if line.startswith("error")]
    assert errors and all(line.startswith("error [refusal]: ") for line in errors)
    assert {Path(line.split(": ")[1].split(":")[0]).stem for line in errors} == \
        set(ASSUMED_WIDTHS)
    for name, why in ASSUMED_WIDTHS.items():
        assert any(name in line and why in line for line in errors), name


def test_cli_bundle_check_agrees_with_the_kernel_loader() -> None:
    from pipeline.load import open_inputs
    from pipeline.validate import check_inputs
    from pipeline.validate_files import check_bundle
    from tests.validation_support import REPOS

    for name in ("tiny-tp2", "tiny-1p1d"):
        path = ROOTS / "scenarios" / f"{name}.yaml"
        cli_view = check_bundle(path, REPOS, refusals=False).problems
        inputs = open_inputs(path, REPOS)
        for pool in range(len(inputs.deployment.pools)):
            assert check_inputs(open_inputs(path, REPOS, pool)).problems() == cli_view
    path = MALFORMED / "rank-fit.yaml"
    assert check_bundle(path, REPOS, refusals=False).problems == \
        check_inputs(open_inputs(path, REPOS)).problems()
