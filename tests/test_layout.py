"""Layout and placement (model.md §5.4, §9.2; golden cases 83–94, §14.2), read from the
views.

Variants are registered in one database per test and the ``pool_layout``,
``pool_allreduce``, ``pool_nodes`` and ``collective_keys`` rows are compared with the spec —
and, for case 94, with an independent rank-layout oracle built the way vLLM numbers ranks.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

import pytest

from pipeline.documents import Chip, CoefficientEntry, Fabric
from pipeline.load import load_document
from pipeline.resources import data_dir
from tests.resolution_support import (
    DS3,
    MM25,
    batch,
    first_refusals,
    inputs,
    query,
    variant,
    with_entries,
)


@functools.cache
def chip(name: str) -> Chip:
    doc, _ = load_document(Chip, data_dir() / "catalog" / "hardware" / f"{name}.yaml")
    return replace(doc, name=name)


def on(inp, gpn: int, nodes: int = 1, rack: int = 0, chip_doc: Chip | None = None,
       fabric: Fabric | None = None, **parallel):
    out = variant(inp, parallel=parallel or None, pool={"nodes": nodes},
                  cluster={"gpus_per_node": gpn, "nodes": nodes, "gpus_per_rack": rack,
                           "hardware": (chip_doc.name if chip_doc else inp.chip.name),
                           "fabric": fabric.name if fabric else ""})
    return replace(out, chip=chip_doc or inp.chip, fabric=fabric)


def layout_rows(variants) -> dict[str, dict]:
    con = batch(variants)
    return {r["scenario"]: r for r in query(con, "SELECT * FROM pool_layout")}


# -- case 90: fabric ratio -----------------------------------------------------------------


def test_fabric_ratio():
    cases = [(450, 50, 9.0), (450, 25, 18.0), (900, 900, 1.0), (450, 0, 1.0), (0, 50, 1.0)]
    variants = {}
    for i, (intra, inter, _) in enumerate(cases):
        c = replace(inputs(DS3).chip, name=f"ratio-chip-{i}", intra_node_bw_gbps=float(intra))
        f = Fabric(name=f"ratio-fabric-{i}", provenance="vendor_spec",
                   inter_node_bw_gbps=float(inter))
        variants[f"r{i}"] = on(inputs(DS3), 8, chip_doc=c, fabric=f)
    rows = layout_rows(variants)
    assert [rows[f"r{i}"]["fabric_ratio"] for i in range(len(cases))] == [c[2] for c in cases]


# -- case 91: nodes spanned ----------------------------------------------------------------


def test_nodes_spanned():
    mm = inputs(MM25)
    nvl = chip("gb200-nvl72")
    not_one_domain = replace(nvl, name="gb200-split", intra_rack_bw_gbps=0.0)
    variants = {
        "tp8": on(mm, 8, tp=8),
        "tp16": on(mm, 8, 2, tp=16),
        "tp1-dp16-ep": on(mm, 8, 2, tp=1, dp=16, enable_expert_parallel=True),
        "rack-one-domain": on(mm, 4, 18, rack=72, chip_doc=nvl, tp=1, dp=72,
                              enable_expert_parallel=True),
        "rack-split": on(mm, 4, 18, rack=72, chip_doc=not_one_domain, tp=1, dp=72,
                         enable_expert_parallel=True),
        "tp8-pcp2": on(mm, 8, 2, tp=8, pcp=2),
        "tp2-pcp4": on(mm, 8, tp=2, pcp=4),
    }
    rows = layout_rows(variants)
    got = {k: rows[k]["nodes_spanned"] for k in variants}
    assert got == {"tp8": 1, "tp16": 2, "tp1-dp16-ep": 2, "rack-one-domain": 1,
                   "rack-split": 18, "tp8-pcp2": 2, "tp2-pcp4": 1}


# -- case 92: custom all-reduce ------------------------------------------------------------


def test_custom_allreduce():
    mm = inputs(MM25)
    nvl = chip("gb200-nvl72")
    con = batch({
        "tp8": on(mm, 8, tp=8),
        "tp3": on(mm, 8, tp=3),
        "tp16": on(mm, 8, 2, tp=16),
        "tp16-rack": on(mm, 8, 2, rack=72, chip_doc=nvl, tp=16),
    })
    rows = {r["scenario"]: r for r in query(con, "SELECT * FROM pool_allreduce")}
    assert rows["tp8"]["custom_all_reduce"] and rows["tp8"]["override_reason"] is None
    assert not rows["tp3"]["custom_all_reduce"]
    assert "rank counts" in rows["tp3"]["override_reason"]
    assert not rows["tp16"]["custom_all_reduce"]
    assert "spans more than" in rows["tp16"]["override_reason"]
    assert rows["tp16-rack"]["custom_all_reduce"]
    overrides = query(con, "SELECT scenario, field, requested, resolved FROM pool_overrides "
                      "ORDER BY scenario")
    assert [(o["scenario"], o["field"], o["requested"], o["resolved"]) for o in overrides] == [
        ("tp16", "allreduce_backend", "custom", "nccl"),
        ("tp3", "allreduce_backend", "custom", "nccl")]


# -- case 93: emit conditions ----------------------------------------------------------------


def test_emit_conditions():
    mm = inputs(MM25)
    con = batch({
        "tp1": on(mm, 8, tp=1),
        "tp8": on(mm, 8, tp=8),
        "ew16": on(mm, 8, 2, tp=1, dp=16, enable_expert_parallel=True),
        "sp": variant(on(mm, 8, 4, tp=2, dp=16, enable_expert_parallel=True),
                      engine={"all2all_backend": "deepep_low_latency"}),
    })
    rows = query(con, "SELECT DISTINCT scenario, emit, emitted FROM pool_nodes")
    got = {(r["scenario"], r["emit"]): r["emitted"] for r in rows}
    expect = {
        "tp1": (True, False, False, False),
        "tp8": (True, True, False, True),
        "ew16": (True, False, True, False),
        "sp": (True, True, True, False),
    }
    for key, (always, tp, ep, unless_sp) in expect.items():
        assert got[(key, "")] is always
        assert got[(key, "tensor_parallel")] is tp
        assert got[(key, "expert_parallel")] is ep
        assert got[(key, "tensor_parallel_unless_sp_moe")] is unless_sp
    sp = query(con, "SELECT sequence_parallel_moe FROM pool_layout WHERE scenario = 'sp'")
    assert sp == [{"sequence_parallel_moe": True}]


# -- cases 83–89: collective width snapping ---------------------------------------------------


def _ranks(con, key, op="all_reduce", group="tp"):
    (row,) = query(con, 'SELECT ranks, refusal FROM collective_keys WHERE scenario = ? AND '
                   'op = ? AND "group" = ?', key, op, group)
    return row


def test_collective_width_snapping():
    ds3 = inputs(DS3)
    con = batch({
        "tp32": on(ds3, 8, 4, tp=32),         # case 84: clamp to the widest measured
        "tp16": on(ds3, 8, 2, tp=16),         # case 85: inside the sweep, unmeasured ...
        "tp16-off": replace(on(ds3, 8, 2, tp=16), assumed_collective_widths=False),
        "tp4": on(ds3, 8, tp=4),              # case 86
        "tp1": on(ds3, 8, tp=1),              # narrower than measured → the narrowest
        "a2a": on(inputs(MM25), 8, tp=2, dp=4, enable_expert_parallel=True),  # case 87
    })
    assert _ranks(con, "tp32")["ranks"] == 8
    # ... priced at 16 ranks from assumed figures, or refused with the extension turned off
    row = _ranks(con, "tp16")
    assert row["ranks"] == 16 and row["refusal"] is None
    row = _ranks(con, "tp16-off")
    assert row["ranks"] is None and "no 16-rank all_reduce measurement for h200" in row["refusal"]
    assert _ranks(con, "tp4")["ranks"] == 4
    assert _ranks(con, "tp1")["ranks"] == 2
    assert _ranks(con, "a2a", "all2all", "expert")["ranks"] == 8
    # case 89: the communicator is snapped to the widest declared width ≤ tp
    names = {r["scenario"]: r["name"] for r in query(
        con, "SELECT scenario, name FROM pool_memory_names WHERE magnitude = 'comm_bytes'")}
    assert names["tp32"] == "nccl_communicator_bytes_8rank"
    assert names["tp4"] == "nccl_communicator_bytes_4rank"


def test_unmeasured_width_names_the_sweep():  # case 83 (gb200-nvl72 is swept at [2 4])
    nvl = chip("gb200-nvl72")
    inp = on(inputs(DS3), 4, 2, chip_doc=nvl, tp=8)
    row = first_refusals({"gb": inp})["gb"]
    assert row is not None
    for needle in ("8-rank", "all_reduce", "gb200-nvl72", "[2 4]"):
        assert needle in row["reason"]


def test_measured_widths_need_the_full_triple():  # case 88
    part = replace(inputs(DS3).chip, name="test-part")

    def e(name: str) -> CoefficientEntry:
        units = "us_per_transfer" if "_floor_" in name else "bytes_per_us"
        return CoefficientEntry(name=name, value=10.0, units=units, method="measured")

    stem2, stem4 = "all_reduce_fp16_2rank_test_part", "all_reduce_fp16_4rank_test_part"
    entries = [e(f"collective_floor_{stem2}"), e(f"collective_peak_rate_{stem2}"),
               e(f"collective_transition_rate_{stem2}"), e(f"collective_floor_{stem4}"),
               e(f"collective_peak_rate_{stem4}")]
    inp = with_entries(on(inputs(DS3), 8, chip_doc=part, tp=2), entries)
    con = batch({"part": inp})
    rows = query(con, "SELECT width FROM pool_measured_widths WHERE coefficient_op = "
                 "'all_reduce'")
    assert [r["width"] for r in rows] == [2]


# -- case 94: placement against a vLLM rank-layout oracle -------------------------------------


def oracle(gpn: int, tp: int, pcp: int, dp: int, dcp: int, group: str) -> tuple[bool, int]:
    """(crosses nodes, most group members on one node), by enumerating ranks.

    vLLM numbers ranks DP × PP × PCP × TP with TP innermost; a node holds ``gpn`` consecutive
    ranks. TP groups are consecutive; PCP groups step by tp; the expert (EP) group is every
    rank of the DP × PCP × TP block; DCP groups split the TP group into consecutive runs
    without PCP; with PCP they run along the PCP axis (step tp) when dcp ≤ pcp and over
    consecutive ranks of the PCP × TP block when dcp > pcp (the kernel's convention, model.md §5.4).
    """
    world = dp * pcp * tp
    groups: list[list[int]] = []
    for d in range(dp):
        for c in range(pcp):
            base = (d * pcp + c) * tp
            if group == "tp":
                groups.append([base + t for t in range(tp)])
            if group == "dcp" and pcp <= 1:
                groups += [[base + t for t in range(s, s + dcp)] for s in range(0, tp, dcp)]
        for t in range(tp):
            if group == "pcp":
                groups.append([(d * pcp + c) * tp + t for c in range(pcp)])
            if group == "dcp" and pcp > 1 and dcp <= pcp:
                groups += [[(d * pcp + c) * tp + t for c in range(s, s + dcp)]
                           for s in range(0, pcp, dcp)]
        if group == "dcp" and pcp > 1 and dcp > pcp:  # runs over the PCP × TP block
            block = d * pcp * tp
            groups += [list(range(block + s, block + s + dcp)) for s in range(0, pcp * tp, dcp)]
    if group == "expert":
        groups = [list(range(world))]
    crosses, most = False, 0
    for g in groups:
        per_node: dict[int, int] = {}
        for rank in g:
            per_node[rank // gpn] = per_node.get(rank // gpn, 0) + 1
        crosses |= len(per_node) > 1
        most = max(most, *per_node.values())
    return crosses, most


def _placement_cases():
    for gpn, tp, pcp, dp in itertools.product((4, 8), (1, 2, 4, 8), (1, 2, 4), (1, 2)):
        for dcp in (1, 2, 4, 8):
            admissible = (tp % dcp == 0) if pcp <= 1 else (dcp <= pcp and pcp % dcp == 0) or (
                dcp > pcp and tp * pcp % dcp == 0 and dcp % pcp == 0 and dcp // pcp <= tp)
            if admissible:
                yield gpn, tp, pcp, dp, dcp


@functools.cache
def _placement_rows():
    mm = inputs(MM25)
    variants = {}
    for gpn, tp, pcp, dp, dcp in _placement_cases():
        world = tp * pcp * dp
        n = max(1, -(-world // gpn))
        variants[f"p-{gpn}-{tp}-{pcp}-{dp}-{dcp}"] = on(
            mm, gpn, n, tp=tp, pcp=pcp, dp=dp, dcp=dcp, enable_expert_parallel=True)
    con = batch(variants)
    return query(con, 'SELECT scenario, "group", width, crosses_nodes, ranks_per_node '
                 "FROM collective_keys WHERE op IN ('all_gather', 'all2all')")


def test_placement_matches_vllm_rank_layout():
    rows = _placement_rows()
    checked = 0
    for r in rows:
        gpn, tp, pcp, dp, dcp = (int(x) for x in r["scenario"].split("-")[1:])
        crosses, most = oracle(gpn, tp, pcp, dp, dcp, r["group"])
        assert (r["crosses_nodes"], r["ranks_per_node"]) == (crosses, most), (r, crosses, most)
        checked += 1
    groups = {r["group"] for r in rows}
    assert groups == {"tp", "expert", "pcp", "dcp"} and checked > 150


@pytest.mark.parametrize("gpn, tp, pcp, dp, dcp, group", [(4, 8, 1, 1, 1, "tp"),
                                                           (4, 2, 4, 1, 2, "dcp")])
def test_oracle_sanity(gpn, tp, pcp, dp, dcp, group):
    # tp 8 on 4-GPU nodes crosses with 4 per node; dcp 2 along pcp (stride 2) fits a node
    assert oracle(gpn, tp, pcp, dp, dcp, group) == ((True, 4) if group == "tp" else (False, 2))
