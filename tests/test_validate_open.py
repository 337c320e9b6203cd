"""``validate`` reports an error exactly when opening the scenario refuses, for every pool.

Over the malformed corpus every bundle is opened for real, every pool. Over the embedded
scenarios (31 pools: opening each for real takes ~20 s on 2 cores) the builder's own checks
decide on one shared database — ``kernel.pool.build._check_inputs`` (the field checks ``open``
runs) and ``kernel.pool.build.refusals`` (the refusal rows ``open`` raises the first of) — and a
sample (the two 16-wide scenarios, a two-pool deployment, a scenario with warnings) is opened
for real as well. Both with and without the assumed collective widths (decisions F1).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.cli.validate import check_scenarios
from kernel.facade import factory
from kernel.pool import build
from pipeline import db
from pipeline.errors import DocumentError, RefusalError
from pipeline.load import Repos, open_inputs
from pipeline.resources import data_dir
from pipeline.validate_files import add_refusals, check_bundle
from tests.embedded import ASSUMED_WIDTHS
from tests.validation_support import MALFORMED, REPOS

BUNDLES = sorted(MALFORMED.glob("*.yaml"))
SAMPLE = [*ASSUMED_WIDTHS, "deepseek-v3-h200-1p1d", "kimi-k3-h100-nospec"]
# Without the assumed extension for unmeasured collective widths, the 16-wide scenarios are
# refused (docs/decisions.md F1): both settings are checked.
STRICT = Repos(assumed_collective_widths=False)


def open_refuses(path: Path | str, repos: Repos) -> str | None:
    """Why opening refuses some pool of ``path`` (None: every pool opens)."""
    try:
        pools = len(open_inputs(path, repos, 0).deployment.pools)
    except DocumentError as exc:
        return str(exc)
    for i in range(pools):
        try:
            factory.new(open_inputs(path, repos, i))
        except (DocumentError, RefusalError) as exc:
            return f"pool {i}: {exc}"
    return None


def test_the_corpus_has_both_outcomes() -> None:
    assert len(BUNDLES) > 60


@pytest.mark.parametrize("path", BUNDLES, ids=[p.stem for p in BUNDLES])
def test_validate_agrees_with_open_on_the_malformed_corpus(path: Path) -> None:
    errors = check_bundle(path, REPOS).errors()
    refused = open_refuses(path, REPOS)
    assert bool(errors) == bool(refused), (errors, refused)


@pytest.mark.parametrize("repos", [Repos(), STRICT], ids=["default", "no-assumed-widths"])
def test_validate_agrees_with_the_builder_on_every_embedded_pool(repos: Repos) -> None:
    checked = {Path(c.file).stem: c for c in check_scenarios(repos.scenarios_root(), repos)}
    con = db.open_db(apply=False)
    inputs = {}
    for name in checked:
        inputs[name] = [open_inputs(name, repos, 0)]
        inputs[name] += [open_inputs(name, repos, i)
                         for i in range(1, len(inputs[name][0].deployment.pools))]
        db.register(con, inputs[name][0])
    db.apply_views(con)
    pools = 0
    for name, per_pool in inputs.items():
        refused = []
        for i, inp in enumerate(per_pool):
            pools += 1
            try:
                build._check_inputs(inp)
            except (DocumentError, RefusalError) as exc:
                refused.append(str(exc))
            refused += [str(r) for r in build.refusals(con, db.scenario_key(inp), i)]
        assert bool(checked[name].errors()) == bool(refused), (name, checked[name].errors(),
                                                               refused)
        assert bool(refused) == (name in ASSUMED_WIDTHS and repos is STRICT), name
    assert pools > len(inputs)  # some deployment has several pools


@pytest.mark.parametrize("name", SAMPLE)
@pytest.mark.parametrize("repos", [Repos(), STRICT], ids=["default", "no-assumed-widths"])
def test_validate_agrees_with_a_real_open(name: str, repos: Repos) -> None:
    path = data_dir() / "scenarios" / f"{name}.yaml"
    errors = check_bundle(path, repos).errors()
    refused = open_refuses(name, repos)
    expected = name in ASSUMED_WIDTHS and repos is STRICT
    assert bool(errors) == bool(refused) == expected, (errors, refused)
    if refused:
        assert any(ASSUMED_WIDTHS[name] in str(e) for e in errors)


def test_a_second_pool_refusal_is_reported_for_that_pool(tmp_path: Path) -> None:
    """Only pool 1 of a two-pool deployment is impossible: validate names pool 1."""
    text = (data_dir() / "scenarios" / "deepseek-v3-h200-1p1d.yaml").read_text()
    head, sep, tail = text.rpartition("tp: 4")
    assert sep and "tp: 8" in head, "the first pool states tp: 8, the second tp: 4"
    path = tmp_path / "second.yaml"
    path.write_text(head + "tp: 3" + tail)
    [checked] = add_refusals([check_bundle(path, Repos(), refusals=False)])
    errors = checked.errors()
    refused = open_refuses(path, Repos())
    assert errors and refused and refused.startswith("pool 1"), (errors, refused)
    assert all("pools[0]" not in e.path for e in errors if e.rule == "refusal")
