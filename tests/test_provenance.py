"""Provenance, evidence, scoping and unit lifting (model.md §9.9, §9.8, §9.10;
model.md §9.10), on several embedded scenarios."""

from __future__ import annotations

import functools

import pytest

from kernel.facade import factory
from kernel.pool import build
from tests.resolution_support import (
    DS3,
    GLM5,
    KIMI,
    NEMOTRON,
    batch,
    entry,
    inputs,
    query,
    variant,
    with_entries,
)

SCENARIOS = [DS3, GLM5, KIMI, NEMOTRON]
EVIDENCED = {"measured", "literature", "vendor_spec"}


@functools.cache
def _con():
    return batch({name: inputs(name) for name in SCENARIOS})


@pytest.mark.parametrize("name", SCENARIOS)
def test_provenance_order_and_counts(name):
    con = _con()
    rows = query(con, "SELECT * FROM provenance WHERE scenario = ? ORDER BY position", name)
    coeffs = [r for r in rows if r["kind"] == "coefficient"]
    kernel = [r for r in rows if r["kind"] == "assumption"]
    assert rows == coeffs + kernel  # coefficients first, then the kernel's assumptions
    names = [r["name"] for r in coeffs]
    assert names == sorted(names, key=lambda s: s.encode())  # ascending byte order
    in_scope = query(con, "SELECT count(*) AS n FROM coefficients_in_scope WHERE scenario = ?",
                     name)[0]["n"]
    assert len(coeffs) == in_scope == len(set(names))
    seqs = [r["seq"] for r in query(con, "SELECT seq FROM pool_assumptions WHERE scenario = ? "
                                    "ORDER BY seq", name)]
    assert [r["name"] for r in kernel] == [r["name"] for r in query(
        con, "SELECT name FROM pool_assumptions WHERE scenario = ? ORDER BY seq", name)]
    assert len(seqs) == len(kernel)
    for r in kernel:
        assert r["set"] == "blis-latency-kernel" and r["method"] == "assumed"
        assert r["scope"] == f"{r['value_text']}: {r['reason']}"
        assert r["scope_kind"] == "assumption" and r["units"] is None
    for r in coeffs:
        assert r["scope"] in ("unscoped",) or r["scope"].startswith(("hardware: ", "model: "))
    # the last assumption is always the engine version (0.29.0 scenarios)
    assert kernel[-1]["name"] == "engine_version"


@pytest.mark.parametrize("name", SCENARIOS)
def test_evidence_counts(name):
    con = _con()
    (ev,) = query(con, "SELECT * FROM evidence WHERE scenario = ?", name)
    rows = query(con, "SELECT name, method FROM provenance WHERE scenario = ? ORDER BY position",
                 name)
    assert ev["total"] == len(rows)
    assert ev["evidenced"] == sum(r["method"] in EVIDENCED for r in rows)
    assert ev["assumed_names"] == [r["name"] for r in rows if r["method"] == "assumed"]


def test_kernel_provenance_matches_view():
    kernel = factory.new(inputs(DS3))
    con = _con()
    rows = query(con, "SELECT name, set, method, scope FROM provenance WHERE scenario = ? "
                 "ORDER BY position", DS3)
    assert [(o.name, o.set, o.method, o.scope) for o in kernel.provenance()] == [
        (r["name"], r["set"], r["method"], r["scope"]) for r in rows]
    evidenced, total, assumed = kernel.evidence()
    (ev,) = query(con, "SELECT * FROM evidence WHERE scenario = ?", DS3)
    assert (evidenced, total, assumed) == (ev["evidenced"], ev["total"], ev["assumed_names"])


def test_scope_text_and_supplying_set():
    con = _con()
    (row,) = query(con, "SELECT set, method, scope FROM provenance WHERE scenario = ? AND "
                   "name = 'hbm_derate'", DS3)
    assert row == {"set": "cost-model-primitives", "method": "vendor_spec",
                   "scope": "hardware: h200"}


def test_last_applicable_entry_wins_case_insensitively():  # model.md §9.8
    inp = with_entries(inputs(DS3), [
        entry("hbm_derate", 0.5, method="assumed", hardware=("H200",)),
        entry("hbm_derate", 0.1, method="assumed", hardware=("h100",)),  # not this part
    ])
    r, _ = build.resolve(inp)
    (origin,) = [o for o in r.provenance if o.name == "hbm_derate"]
    assert origin.set == "test-extra" and origin.scope == "hardware: H200"
    assert r.coefficients.hbm_bps == inputs(DS3).chip.bw_peak_tbs * 1e12 * 0.5


def test_scope_axes_tp_ep_nodes():  # model.md §9.8 tp / ep / nodes_spanned dimensions
    from dataclasses import replace as dc_replace

    from pipeline.documents import Scope

    def scoped(value: float, **axes):
        return dc_replace(entry("moe_routing_imbalance_median", value, method="assumed"),
                          scope=Scope(hardware=("h200",), **axes))

    base = inputs(DS3)
    con = batch({
        "tp8": with_entries(base, [scoped(2.0, tp=(8,)), scoped(3.0, tp=(4,))], "by-tp"),
        "ep": with_entries(base, [scoped(2.0, ep=(1,)), scoped(3.0, ep=(16,))], "by-ep"),
        "nodes": with_entries(base, [scoped(2.0, nodes_spanned=(1,)),
                                     scoped(3.0, nodes_spanned=(2,))], "by-nodes"),
        "tp4": variant(with_entries(base, [scoped(2.0, tp=(8,)), scoped(3.0, tp=(4,))],
                                    "by-tp"), parallel={"tp": 4}),
    })
    got = {r["scenario"]: r["moe_imbalance"] for r in query(
        con, "SELECT scenario, moe_imbalance FROM resolved_pools")}
    assert got == {"tp8": 2.0, "ep": 2.0, "nodes": 2.0, "tp4": 3.0}


def test_unit_lifting():  # model.md §9.9: µs → int(us*1000) ns; bytes/µs and tokens/µs × 1e6
    inp = with_entries(inputs(KIMI), [
        entry("host_output_token", 1.001, method="assumed", hardware=("h100",),
              units="us_per_token"),
        entry("attention_decode_rate", 1234.5, method="assumed", hardware=("h100",),
              units="bytes_per_us"),
    ])
    r, _ = build.resolve(inp)
    # 1.001 * 1000 is 1000.999… in float64: the conversion truncates, as Go's Duration does
    assert r.coefficients.host_output_token_ns == int(1.001 * 1000) == 1000
    assert r.coefficients.attention_rate_bps == 1234.5 * 1e6
    floor_ns, rate = r.coefficients.recurrent["kda"]
    con = _con()
    (raw,) = query(con, "SELECT value FROM coefficients_in_scope WHERE scenario = ? AND "
                   "name = 'recurrent_decode_rate_kda'", KIMI)
    assert rate == raw["value"] * 1e6
    (fl,) = query(con, "SELECT value FROM coefficients_in_scope WHERE scenario = ? AND "
                  "name = 'recurrent_decode_floor_kda'", KIMI)
    assert floor_ns == int(fl["value"] * 1000)


def test_collective_coefficients_lifted():
    r, _ = build.resolve(inputs(DS3))
    key = r.collectives[("all_reduce", "tp")]
    assert (key.width, key.ranks, key.crosses_nodes, key.span) == (8, 8, False, 1.0)
    con = _con()
    vals = {row["name"]: row["value"] for row in query(
        con, "SELECT name, value FROM coefficients_in_scope WHERE scenario = ? AND name LIKE "
        "'collective_%all_reduce_fp16_8rank_h200'", DS3)}
    assert key.floor_ns == int(vals["collective_floor_all_reduce_fp16_8rank_h200"] * 1000)
    assert key.peak_bps == vals["collective_peak_rate_all_reduce_fp16_8rank_h200"] * 1e6
    assert key.transition_bps == vals["collective_transition_rate_all_reduce_fp16_8rank_h200"] * 1e6
