"""Validate documents in two layers (model.md §12.7): field checks, then the rules pack.

The field layer never depends on the engine release: each document's own checks plus the
deployment-against-cluster checks. The rule layer (:mod:`pipeline.rulecheck`) runs only when
the field layer has no errors and there is a scenario. Warnings never block anything.

Per-document validators return paths relative to their document; a bundle merges them under
the prefixes of model.md §12.7 (``scenario``, ``deployment``, ``model``, ``chip``, ``fabric``,
``device:<name>``, ``coefficients:<set name>``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from dataclasses import field as _field

from .documents import (
    Chip,
    CoefficientSet,
    Deployment,
    Fabric,
    Graph,
    Scenario,
    StorageDevice,
)
from .errors import DocumentError, Problem
from .load import Inputs, Loaded
from .rulecheck import RuleContext, check_rules, engine_version_problem
from .rules import RulesPack, lookup
from .validate_coefficients import validate_coefficient_set
from .validate_common import join
from .validate_deployment import validate_deployment
from .validate_graph import validate_graph, validate_identity
from .validate_hardware import validate_chip, validate_fabric, validate_storage
from .validate_limits import validate_pricing_limits
from .validate_scenario import validate_scenario

__all__ = [
    "Report", "check_inputs", "require_valid", "validate_bundle", "validate_chip",
    "validate_coefficient_set", "validate_deployment", "validate_documents", "validate_fabric",
    "validate_graph", "validate_identity", "validate_scenario", "validate_storage",
]


def _ordered(problems: Iterable[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.path, p.message))


@dataclass
class Report:
    """The outcome of validating a bundle: field problems, rule problems, the pack applied."""

    field: list[Problem] = _field(default_factory=list)
    rule: list[Problem] = _field(default_factory=list)
    rules_applied: str = ""

    def problems(self) -> list[Problem]:
        """Field problems, then rule problems, each layer sorted by path then message."""
        return _ordered(self.field) + _ordered(self.rule)

    def errors(self) -> list[Problem]:
        return [p for p in self.problems() if p.severity == "error"]

    def warnings(self) -> list[Problem]:
        return [p for p in self.problems() if p.severity == "warning"]

    def ok(self) -> bool:
        """No errors in either layer (warnings allowed)."""
        return not self.errors()


def _prefixed(prefix: str, problems: Iterable[Problem]) -> list[Problem]:
    return [replace(p, path=join(prefix, p.path)) for p in problems]


def validate_documents(*, scenario: Scenario | None = None, deployment: Deployment | None = None,
                       model: Graph | None = None, chip: Chip | None = None,
                       fabric: Fabric | None = None, devices: Sequence[StorageDevice] = (),
                       coefficients: Sequence[CoefficientSet] = (),
                       sources: Mapping[str, Loaded] | None = None,
                       pack: RulesPack | None = None) -> Report:
    """Validate whatever documents are given (Go's ``Validate(Bundle)``).

    ``sources`` maps ``scenario``/``deployment``/``model``/``chip``/``fabric``/``devices``/
    ``coefficients:<name>`` to where each document came from (file and line map), as
    :func:`pipeline.load.open_inputs` records them. ``pack`` defaults to the one registered
    for the scenario's ``engine_version``.
    """
    sources = sources or {}

    def src(key: str) -> tuple[str, Mapping[str, int]]:
        loaded = sources.get(key)
        return (loaded.file, loaded.lines) if loaded else (f"<{key}>", {})

    found: list[Problem] = []
    if scenario is not None:
        found += _prefixed("scenario", validate_scenario(scenario, *src("scenario")))
    if deployment is not None:
        file, lines = src("deployment")
        cluster = scenario.cluster if scenario is not None else None
        found += _prefixed("deployment", validate_deployment(deployment, file, cluster, lines))
        if scenario is None:
            found.append(Problem(file, "deployment", "a deployment is checked against a "
                                 "scenario's cluster, but the bundle has no scenario"))
        # what the engine refuses at startup and the kernel cannot hold (RL9)
        found += _prefixed("deployment", validate_pricing_limits(
            deployment, model, file, lines, src("model")[0] if model is not None else None))
    if model is not None:
        found += _prefixed("model", validate_graph(model, *src("model")))
    if chip is not None:
        found += _prefixed("chip", validate_chip(chip, *src("chip")))
    if fabric is not None:
        found += _prefixed("fabric", validate_fabric(fabric, *src("fabric")))
    if devices:
        found += [replace(p, path=f"device:{p.path}")
                  for p in validate_storage(devices, *src("devices"))]
    for cset in coefficients:
        found += _prefixed(f"coefficients:{cset.name}",
                           validate_coefficient_set(cset, *src(f"coefficients:{cset.name}")))
    report = Report(field=found)
    if scenario is None or any(p.severity == "error" for p in found):
        return report
    pack = pack or lookup(scenario.engine_version)
    s_file, s_lines = src("scenario")
    if pack is None:
        report.rule.append(engine_version_problem(scenario, s_file, s_lines))
        return report
    d_file, d_lines = src("deployment")
    m_file, m_lines = src("model")
    ctx = RuleContext(pack, scenario, deployment, model, d_file, d_lines, m_file, m_lines)
    report.rule = check_rules(ctx)
    report.rules_applied = pack.version
    return report


def validate_bundle(inputs: Inputs) -> Report:
    """Validate everything a kernel would be built from (both layers)."""
    report = validate_documents(
        scenario=inputs.scenario, deployment=inputs.deployment, model=inputs.model,
        chip=inputs.chip, fabric=inputs.fabric, devices=inputs.devices,
        coefficients=inputs.coefficients, sources=inputs.sources, pack=inputs.rules)
    if not 0 <= inputs.pool_index < len(inputs.deployment.pools):
        file = inputs.sources["deployment"].file if "deployment" in inputs.sources else ""
        report.field.append(Problem(file, "deployment.pools", f"pool index "
                                    f"{inputs.pool_index} is outside the deployment's "
                                    f"{len(inputs.deployment.pools)} pool(s)"))
        report.rule, report.rules_applied = [], ""
    return report


check_inputs = validate_bundle


def require_valid(inputs: Inputs, rules: bool = True) -> Report:
    """Raise :class:`DocumentError` listing every error; return the report (warnings) if none.

    ``rules=False`` raises only for field-layer errors (model.md §12.1: upstream, a rule
    problem does not stop kernel construction); rule errors then stay in the report.
    """
    report = check_inputs(inputs)
    errors = report.errors() if rules else [p for p in report.field if p.severity == "error"]
    if errors:
        raise DocumentError(errors)
    return report
