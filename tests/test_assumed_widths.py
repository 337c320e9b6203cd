"""The assumed extension for unmeasured collective widths (issue 18; docs/decisions.md)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.model import laws
from pipeline.documents import CoefficientSet
from pipeline.load import load_document
from pipeline.resources import data_dir
from tests.resolution_support import DS3, MM25_EP16, batch, inputs, nodes, query, variant

_NAME = re.compile(r"collective_(floor|peak_rate|transition_rate)_(\w+?)_fp16_(\d+)rank_(\w+)")


def _fp16_sweeps() -> dict[tuple[str, str, str], dict[int, float]]:
    cset, _ = load_document(CoefficientSet, data_dir() / "registry" / "coefficients"
                            / "cost-model-collectives.yaml")
    out: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    for e in cset.coefficients:
        m = _NAME.fullmatch(e.name)
        if m:
            part, op, width, chip = m.groups()
            out[(chip, op, part)][int(width)] = e.value
    return out


def test_rule_reproduces_the_measured_8_rank_figures_from_2_and_4() -> None:
    """Hold-out check on every NVLink part measured at 8 ranks: the rule, fed the 2- and
    4-rank figures, lands within 1.35x of each measured 8-rank figure, 1.1x on geometric
    mean. (l40s is PCIe: its rates collapse with width, and no NVLink rule describes it.)"""
    errors = []
    for (chip, _op, part), widths in _fp16_sweeps().items():
        if chip == "l40s" or not {2, 4, 8} <= set(widths):
            continue
        pred = laws.assumed_collective_figure(part, 8, 4, widths[4], 2, widths[2])
        errors.append(abs(math.log(pred / widths[8])))
    assert len(errors) == 5 * 4 * 3  # a100-sxm, b200, b300, h100, h200 × 4 ops × 3 figures
    assert max(errors) <= math.log(1.35)
    assert math.exp(sum(errors) / len(errors)) <= 1.1


@given(w1=st.sampled_from([2, 4, 8]), extra=st.integers(1, 64),
       v1=st.floats(1.0, 1e6), v0=st.floats(1.0, 1e6))
def test_rule_properties(w1: int, extra: int, v1: float, v0: float) -> None:
    width, w0 = w1 + extra, w1 // 2 if w1 > 2 else w1
    floor = laws.assumed_collective_figure("floor", width, w1, v1, w0, v0)
    assert floor >= v1  # a wider ring never has a lower floor
    for part in ("peak_rate", "transition_rate"):
        rate = laws.assumed_collective_figure(part, width, w1, v1, w0, v0)
        assert 0 < rate <= v1 and rate >= v1 * (w1 - 1) / w1  # bus factor stays in (1/2, 1]
        assert laws.assumed_collective_figure(part, w1, w1, v1, w0, v0) == pytest.approx(v1)


def test_rule_rejects_an_unknown_figure() -> None:
    with pytest.raises(ValueError, match="unknown collective figure"):
        laws.assumed_collective_figure("latency", 16, 8, 1.0, 4, 1.0)


def test_extension_is_derived_only_where_a_16_wide_key_has_no_measurement() -> None:
    ds3 = inputs(DS3)
    con = batch({
        "ds3": ds3,                                              # 8 wide: nothing derived
        "tp32": nodes(variant(ds3, parallel={"tp": 32}), 4),     # case 84: clamps, no entry
        "tp16": nodes(variant(ds3, parallel={"tp": 16}), 2),
        "tp16-off": replace(nodes(variant(ds3, parallel={"tp": 16}), 2),
                            assumed_collective_widths=False),
        "ep16": inputs(MM25_EP16),
    })
    rows = query(con, "SELECT * FROM collective_width_extension ORDER BY scenario, name")
    by = defaultdict(list)
    for r in rows:
        by[r["scenario"]].append(r)
    assert set(by) == {"tp16", "ep16"}
    # the three tp keys (and EP's all2all on the 16-wide expert group for ep16)
    assert {r["coefficient_op"] for r in by["tp16"]} == {"all_reduce", "all_gather",
                                                         "reduce_scatter"}
    assert {r["coefficient_op"] for r in by["ep16"]} == {"all_reduce", "all_gather",
                                                         "reduce_scatter", "alltoall"}
    sweeps = _fp16_sweeps()
    for r in by["ep16"]:
        assert r["method"] == "assumed" and r["set"] == "assumed-collective-widths"
        assert r["width"] == 16 and r["chip"] == "h200"
        m = sweeps[("h200", r["coefficient_op"], r["part"])]
        assert r["value"] == laws.assumed_collective_figure(r["part"], 16, 8, m[8], 4, m[4])
        assert "no 16-rank measurement" in r["rationale"] and "span" in r["rationale"]
    keys = {(k["scenario"], k["op"]): k for k in query(
        con, "SELECT scenario, op, ranks, assumed, floor_ns, crosses_nodes, span, refusal "
        "FROM collective_keys WHERE \"group\" = 'tp'")}
    assert keys[("tp32", "all_reduce")]["ranks"] == 8 and not keys[("tp32", "all_reduce")][
        "assumed"]
    tp16 = keys[("tp16", "all_reduce")]
    assert tp16["ranks"] == 16 and tp16["assumed"] and tp16["refusal"] is None
    # the fabric enters through the span, as for any node-crossing group: ring over 2 nodes
    assert tp16["crosses_nodes"] and tp16["span"] == pytest.approx(laws.ring_span(16, 8, 9.0))
    assert tp16["floor_ns"] == laws.us_to_duration_ns(
        laws.assumed_collective_figure("floor", 16, 8, 15.98, 4, 9.44))
    assert keys[("tp16-off", "all_reduce")]["ranks"] is None
    assert "turned off" in keys[("tp16-off", "all_reduce")]["refusal"]


def test_a_measured_16_rank_figure_wins_over_the_extension() -> None:
    from tests.resolution_support import widened_collectives

    tp16 = nodes(variant(inputs(DS3), parallel={"tp": 16}), 2)
    con = batch({"measured": widened_collectives(tp16)})
    assert query(con, "SELECT * FROM collective_width_extension") == []
    prov = query(con, "SELECT name, set, method FROM provenance WHERE name LIKE '%16rank%'")
    assert prov and all(p["set"] == "test-collectives-16" for p in prov)
