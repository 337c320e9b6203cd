"""MoE decode under the measured layer (issue 34, decisions MO1-MO3).

The reference keeps routed-expert FLOPs undivided by tp (model.md §4.2); the measured layer's
``moe_expert_tp_split`` divides them by every expert shard, as vLLM's FusedMoE runs a tp slice
of each expert. The reference switch stays bit for bit (tests/test_step_golden.py)."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import polars as pl
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from kernel.model import laws, step
from kernel.registry_fit.layer import moe_engine_set
from pipeline.resources import data_dir

REFERENCE = kernel.Repos(pricing="reference")
SCEN = data_dir() / "measurements" / "simtoreal" / "scenarios"
MIXTRAL_TP2 = "mixtral-8x7b-h100-tp2"
MIXTRAL_22B_TP8 = str(SCEN / "simtoreal-mixtral-8x22b-v0.1-h100-tp8-mbt2048-gmu90.yaml")
EP_POOL = "minimax-m25-h200-ep16"  # expert parallelism on: whole experts per rank
LAYER = data_dir() / "registry" / "layers" / "vllm-0.31.0" / "coefficients"


@pytest.mark.parametrize("tokens", [1, 2, 3])
def test_experts_touched_is_the_expected_distinct_count(tokens: int) -> None:
    """8 experts, top-2: the law's n(1-((E-k)/E)^t) against an exact enumeration of every
    routing of ``tokens`` tokens (each picks 2 distinct experts, uniformly)."""
    pairs = list(itertools.combinations(range(8), 2))
    total = count = 0
    for routing in itertools.product(pairs, repeat=tokens):
        total += len({e for pair in routing for e in pair})
        count += 1
    assert laws.experts_touched(tokens, 8, 2, 8) == pytest.approx(total / count, rel=1e-12)


def _routed(k: kernel.Kernel, batch: kernel.Batch) -> tuple[float, float]:
    rows = [r for r in step.layer_breakdown(k.resolved_pool, batch) if r["routed_hbm"] > 0]
    assert rows, "the pool has routed experts"
    return rows[0]["routed_sm"], rows[0]["routed_hbm"]


@settings(max_examples=25, deadline=None)
@given(decodes=st.integers(1, 128), context=st.integers(0, 3000), prefill=st.integers(0, 600))
def test_measured_layer_divides_routed_flops_by_tp(decodes: int, context: int,
                                                   prefill: int) -> None:
    """With expert parallelism off, the measured layer's routed SM time (MO1 alone) is the
    reference's / tp (tp 2 and 8: exact in binary) and the expert weight reads are unchanged."""
    reqs = [kernel.Request(1, context)] * decodes
    if prefill:
        reqs.append(kernel.Request(prefill, 0))
    batch = kernel.Batch(reqs)
    for scen, tp in ((MIXTRAL_TP2, 2), (MIXTRAL_22B_TP8, 8)):
        ref_sm, ref_hbm = _routed(_open(scen, True), batch)
        new_sm, new_hbm = _routed(_open(scen, False), batch)
        assert new_sm * tp == ref_sm
        assert new_hbm == ref_hbm


_KERNELS: dict[tuple[str, bool], kernel.Kernel] = {}
_MO1: list[kernel.Repos] = []


def mo1_only() -> kernel.Repos:
    """The measured layer with its vllm-moe sets as decision MO1 wrote them (the tp split, not
    the fused MoE law of decision MF1, which tests/test_moe_fit.py pins)."""
    if not _MO1:
        where = Path(tempfile.mkdtemp()) / "coefficients"
        where.mkdir(parents=True)
        for f in LAYER.glob("*.yaml"):
            text = f.read_text()
            if f.name.startswith("vllm-moe-"):
                text = yaml.safe_dump(moe_engine_set(f.stem.removeprefix("vllm-moe-"),
                                                     "vllm:0.31.0"), sort_keys=False)
            (where / f.name).write_text(text)
        _MO1.append(kernel.Repos(layer=str(where.parent)))
    return _MO1[0]


def _open(scen: str, reference: bool) -> kernel.Kernel:
    key = (scen, reference)
    if key not in _KERNELS:
        _KERNELS[key] = kernel.open(scen, REFERENCE if reference else mo1_only())
    return _KERNELS[key]


def test_expert_parallel_pool_keeps_its_routed_flops() -> None:
    """With expert parallelism on a rank runs whole experts: the switch is not read."""
    batch = kernel.Batch([kernel.Request(1, 1000)] * 16)
    new = kernel.open(EP_POOL)
    assert new.resolved_pool.coefficients.moe_expert_tp_split == 1.0
    assert _routed(new, batch)[0] == _routed(kernel.open(EP_POOL, REFERENCE), batch)[0]


def test_switch_is_in_the_provenance_and_absent_from_the_reference() -> None:
    new, ref = kernel.open(MIXTRAL_TP2), kernel.open(MIXTRAL_TP2, REFERENCE)
    assert ref.resolved_pool.coefficients.moe_expert_tp_split == 0.0
    frame = new.provenance_frame().filter(pl.col("name") == "moe_expert_tp_split")
    assert frame.height == 1 and frame["method"][0] == "literature"
    assert not ref.provenance_frame()["name"].eq("moe_expert_tp_split").any()


def test_registry_fit_writes_the_embedded_moe_sets() -> None:
    """Every chip of the layer carries the set ``registry fit`` writes, unchanged."""
    chips = sorted(p.stem.removeprefix("vllm-all-reduce-")
                   for p in LAYER.glob("vllm-all-reduce-*.yaml"))
    assert chips
    for chip in chips:
        shipped = yaml.safe_load((LAYER / f"vllm-moe-{chip}.yaml").read_text())
        engine = moe_engine_set(chip, "vllm:0.31.0")
        # the engine fact first, unchanged; the fused MoE law after it (decision MF1)
        assert shipped["name"] == engine["name"]
        assert shipped["coefficients"][0] == engine["coefficients"][0]


def test_bulk_and_scalar_agree_on_a_moe_pool_under_the_measured_layer() -> None:
    from kernel.bulk import price
    k = kernel.open(MIXTRAL_TP2)
    shapes = [[(1, 700)], [(1, 500)] * 11, [(1, 900)] * 40 + [(256, 300)], [(2048, 0)]]
    rows = [(b, s, c) for b, reqs in enumerate(shapes) for s, c in reqs]
    df = pl.DataFrame({"batch_id": [r[0] for r in rows], "scheduled": [r[1] for r in rows],
                       "computed": [r[2] for r in rows],
                       "prompt_len": [r[1] + r[2] for r in rows]})
    got = price(k, df).sort("batch_id")
    for b, reqs in enumerate(shapes):
        est = k.step_time(kernel.Batch([kernel.Request(s, c) for s, c in reqs]))
        assert got["no_overlap_ns"][b] == est.no_overlap
        assert got["overlap_ns"][b] == est.overlap


def test_layer_without_the_moe_set_prices_as_the_reference_does(tmp_path: Path) -> None:
    """The routed SM term moves only through the MoE set: without it, as the reference."""
    where = tmp_path / "layer" / "coefficients"
    where.mkdir(parents=True)
    for f in LAYER.glob("*.yaml"):
        if not f.name.startswith("vllm-moe-"):
            (where / f.name).write_text(f.read_text())
    k = kernel.open(MIXTRAL_TP2, kernel.Repos(layer=str(tmp_path / "layer")))
    batch = kernel.Batch([kernel.Request(1, 800)] * 8)
    assert _routed(k, batch) == _routed(kernel.open(MIXTRAL_TP2, REFERENCE), batch)
