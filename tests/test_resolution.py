"""Overrides with reasons, assumptions recorded exactly when a setting is unstated, and the
resolved engine settings (model.md §9.1, §9.5–§9.7; cases: model.md §14.3).
Spec case numbers are cited per test.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from kernel.facade import factory
from kernel.model import laws
from kernel.pool import build
from pipeline.documents import PDTransfer, Speculative
from tests.resolution_support import (
    DS3,
    GLM5,
    KIMI,
    MM25_EP16,
    NEMOTRON,
    PD,
    batch,
    inputs,
    query,
    unstated,
    variant,
    widened_collectives,
)


def assumption_names(resolved) -> list[str]:
    return [a.name for a in resolved.assumptions]


def assumption(resolved, name):
    found = [a for a in resolved.assumptions if a.name == name]
    return found[0] if found else None


# -- overrides -------------------------------------------------------------------------------


def test_allreduce_custom_to_nccl_across_nodes():  # case 144
    inp = widened_collectives(variant(inputs(MM25_EP16), parallel={"dp": 1}))
    kernel = factory.new(inp)
    res = kernel.resolved()
    assert res.tensor_parallel_width == 16
    assert res.all_reduce_backend == "nccl"
    (ov,) = [o for o in res.overrides if o.field == "allreduce_backend"]
    assert (ov.requested, ov.resolved) == ("custom", "nccl")
    assert "spans more than one node" in ov.reason
    assert res.expert_parallel_width == 16


def test_allreduce_not_requested_is_not_overridden():
    inp = widened_collectives(variant(inputs(MM25_EP16), engine={"allreduce_backend": "nccl"}))
    res = factory.new(inp).resolved()
    assert res.all_reduce_backend == "nccl" and res.overrides == ()


def test_interleave_under_nixl():
    base = variant(inputs("glm5-h200-tp8-dcp4"),
                   deployment={"pd_transfer": PDTransfer(connector="NixlConnector")})
    r, res = build.resolve(base)
    (ov,) = [o for o in res.overrides if o.field == "cp_kv_cache_interleave_size"]
    assert ov.requested == "unstated (engine default 1)" and ov.resolved == "64"
    assert "NixlConnector" in ov.reason and r.dcp_interleave == 64
    r2, res2 = build.resolve(inputs("glm5-h200-tp8-dcp4"))  # no connector: engine default 1
    assert r2.dcp_interleave == 1
    assert not [o for o in res2.overrides if o.field == "cp_kv_cache_interleave_size"]


def test_cache_dtype_fp8_to_fp8_ds_mla_on_hopper():  # model.md §9.7, case 126/127
    r, res = build.resolve(inputs(GLM5))
    (ov,) = [o for o in res.overrides if o.field == "cache_dtype"]
    assert (ov.requested, ov.resolved) == ("fp8", "fp8_ds_mla")
    assert r.cache_layout == "fp8_ds_mla"
    assert r.kv_bytes_per_token / r.kv_layers == 656
    assert assumption(r, "sparse_mla_backend") is None


def test_fp8_e4m3_selects_flashinfer_sm90():  # case 127
    r, res = build.resolve(variant(inputs(GLM5), engine={"cache_dtype": "fp8_e4m3"}))
    a = assumption(r, "sparse_mla_backend")
    assert a is not None and a.scope.startswith("FLASHINFER_MLA_SPARSE_SM90: ")
    assert not [o for o in res.overrides if o.field == "cache_dtype"]


def test_kv_per_layer_blackwell_pcp_dcp():  # case 126
    inp = inputs(GLM5)
    bw = replace(inp, chip=replace(inp.chip, tflops_nvfp4=4500.0))
    con = batch({"g-dcp4": variant(bw, parallel={"tp": 2, "pcp": 4, "dcp": 4}),
                 "g-dcp1": variant(bw, parallel={"tp": 2, "pcp": 4, "dcp": 1})})
    rows = {r["scenario"]: r for r in query(
        con, "SELECT scenario, kv_bytes_per_token / kv_layers AS per_layer FROM pool_kv")}
    assert rows["g-dcp4"]["per_layer"] == 656
    assert rows["g-dcp1"]["per_layer"] == 576


def test_mamba_none_overridden_to_align():  # model.md §9.1 step 15
    r, res = build.resolve(variant(inputs(KIMI), engine={"mamba_cache_mode": "none"}))
    (ov,) = [o for o in res.overrides if o.field == "mamba_cache_mode"]
    assert (ov.requested, ov.resolved) == ("none", "align")
    assert r.recurrent_cache_mode == "align"
    assert assumption(r, "mamba_cache_mode") is None


@functools.cache
def _mamba_batch():
    base = inputs(KIMI)
    return batch({
        "kimi-unstated": base,
        "kimi-no-prefix": variant(base, engine={"enable_prefix_caching": False}),
        "kimi-none-no-prefix": variant(base, engine={"enable_prefix_caching": False,
                                                     "mamba_cache_mode": "none"}),
        "kimi-all": variant(base, engine={"mamba_cache_mode": "all"}),
    })


@pytest.mark.parametrize("key, mode, assumed", [
    ("kimi-unstated", "align", True), ("kimi-no-prefix", "none", True),
    ("kimi-none-no-prefix", "none", False), ("kimi-all", "all", False)])
def test_mamba_cache_mode_resolution(key, mode, assumed):
    con = _mamba_batch()
    (row,) = query(con, "SELECT recurrent_cache_mode FROM resolved_pools WHERE scenario = ?", key)
    assert row["recurrent_cache_mode"] == mode
    names = [r["name"] for r in query(con, "SELECT name FROM pool_assumptions WHERE scenario = ?",
                                      key)]
    assert ("mamba_cache_mode" in names) == assumed
    overrides = query(con, "SELECT * FROM pool_overrides WHERE scenario = ?", key)
    assert overrides == []


# -- assumptions exactly when unstated -------------------------------------------------------


def test_cudagraph_mode_assumed_only_when_unstated():  # case 107
    unstated, _ = build.resolve(variant(inputs(DS3), engine={"cudagraph_mode": ""}))
    stated, _ = build.resolve(variant(inputs(DS3),
                                      engine={"cudagraph_mode": "FULL_AND_PIECEWISE"}))
    assert "cudagraph_mode" in assumption_names(unstated)
    assert "cudagraph_mode" not in assumption_names(stated)
    a = assumption(unstated, "cudagraph_mode")
    assert a.scope.startswith("FULL_AND_PIECEWISE: ") and a.set == "blis-latency-kernel"
    same = replace(unstated, provenance=stated.provenance, assumptions=stated.assumptions)
    assert same == stated  # identical resolution otherwise
    assert (stated.decode_graph_mode, stated.other_graph_mode) == ("FULL", "PIECEWISE")


def test_three_unstated_settings_add_three_entries():  # case 109
    base, _ = build.resolve(inputs(DS3))
    bare, _ = build.resolve(unstated(inputs(DS3), "max_num_batched_tokens", "block_size",
                                     "cudagraph_mode"))
    assert len(bare.provenance) == len(base.provenance) + 3
    added = set(assumption_names(bare)) - set(assumption_names(base))
    assert added == {"max_num_batched_tokens", "block_size", "cudagraph_mode"}
    assert bare.block_size == 16 and bare.max_num_batched_tokens == 8192


def test_engine_version_assumption():  # case 120
    old, _ = build.resolve(inputs(DS3))
    new_, _ = build.resolve(variant(inputs(DS3), scenario={"engine_version": "0.31.0"}))
    a = assumption(old, "engine_version")
    assert a is not None and a.scope.startswith("0.31.0: ") and "0.29.0" in a.scope
    assert assumption(new_, "engine_version") is None


def test_dsa_block_default_64():  # case 123
    r, _ = build.resolve(inputs(GLM5))
    assert r.block_size == 64 and r.block_size_final
    assert assumption(r, "block_size").scope.startswith("64: ")
    r16, _ = build.resolve(inputs(DS3))
    assert r16.block_size == 16 and assumption(r16, "block_size") is None  # stated


def test_dcp_backend_assumed_when_unstated():  # case 141
    con = batch({
        "ds3-dcp8": variant(inputs(DS3), parallel={"dcp": 8}),
        "ds3-dcp8-a2a": variant(inputs(DS3), parallel={"dcp": 8},
                                engine={"dcp_comm_backend": "a2a"}),
        "ds3-dcp1": inputs(DS3),
    })
    rows = query(con, "SELECT scenario, scope FROM provenance WHERE name = 'dcp_comm_backend'")
    assert [r["scenario"] for r in rows] == ["ds3-dcp8"]
    assert rows[0]["scope"].startswith("ag_rs")
    keys = {(r["scenario"], r["op"], r["group"]) for r in query(
        con, "SELECT scenario, op, \"group\" FROM collective_keys WHERE \"group\" = 'dcp'")}
    assert keys == {("ds3-dcp8", "all_gather", "dcp"), ("ds3-dcp8", "reduce_scatter", "dcp"),
                    ("ds3-dcp8-a2a", "all_gather", "dcp"), ("ds3-dcp8-a2a", "all2all", "dcp")}
    assert query(con, "SELECT count(*) AS n FROM refusals WHERE scenario LIKE 'ds3%'")[0]["n"] == 0


def test_optional_coefficients_absent_are_assumptions():  # cases 117–119
    kimi, _ = build.resolve(
        _drop(inputs(KIMI), "recurrent_decode_rate_kda"))
    a = assumption(kimi, "recurrent_decode_rate_kda")
    assert a is not None and a.scope == "absent: priced as no recurrent term"
    assert "kda" not in kimi.coefficients.recurrent
    ds3, _ = build.resolve(_drop(inputs(DS3), "recurrent_decode_rate_kda"))
    assert assumption(ds3, "recurrent_decode_rate_kda") is None  # DS3 has no kda layer
    ds3b, _ = build.resolve(_drop(inputs(DS3), "host_launch_per_kernel"))
    assert assumption(ds3b, "host_launch_per_kernel").scope == "absent: priced as 0"
    assert ds3b.coefficients.host_launch_per_kernel_ns == 0


def _drop(inp, name):
    return replace(inp, coefficients=tuple(
        replace(s, coefficients=tuple(e for e in s.coefficients if e.name != name))
        for s in inp.coefficients))


def test_resolution_defaults_and_stated():  # model.md §12.9
    _, res = build.resolve(inputs(DS3))
    assert res.async_scheduling is True and res.cascade_attention is False
    _, res2 = build.resolve(variant(inputs(DS3), engine={"async_scheduling": False,
                                                         "disable_cascade_attn": False}))
    assert res2.async_scheduling is False and res2.cascade_attention is True


def test_disaggregated_pools():  # case 145
    k0 = factory.open_pool(PD, None, 0)
    k1 = factory.open_pool(PD, None, 1)
    assert k0.deployment().role == "prefill" and k1.deployment().role == "decode"
    assert (k0.resolved().tensor_parallel_width, k0.resolved().data_parallel_width) == (8, 1)
    assert (k1.resolved().tensor_parallel_width, k1.resolved().data_parallel_width) == (4, 2)
    assert k0.resolved_pool.max_num_batched_tokens == 8192
    assert k1.resolved_pool.max_num_batched_tokens == 2048
    assert k1.deployment().engine.max_num_batched_tokens == 2048


def test_kernel_does_not_share_state_with_inputs():
    inp = inputs(DS3)
    kernel = factory.new(inp)
    pool = kernel.deployment()
    assert pool == inp.pool and pool is not inp.pool


# -- graph modes and capture sizes (model.md §9.5–§9.6) ------------------------


GRAPH_CASES = {
    # key: (engine changes, expected (decode, other), capture tokens)
    "unstated": ({"cudagraph_mode": ""}, ("FULL", "PIECEWISE"), 512),
    "fdo": ({"cudagraph_mode": "FULL_DECODE_ONLY"}, ("FULL", "NONE"), 512),
    # FULL on DS3: FlashMLA declares UNIFORM_BATCH, below ALWAYS, so mixed batches run piecewise
    # (model.md §9.5 rule 8; tests/test_graph_modes.py has FULL kept on FlashAttention 3)
    "full": ({"cudagraph_mode": "full"}, ("FULL", "PIECEWISE"), 512),
    "none": ({"cudagraph_mode": "NONE"}, ("NONE", "NONE"), 0),
    "seqs100": ({"max_num_seqs": 100, "max_num_batched_tokens": 2048}, ("PIECEWISE",) * 2, 200),
    "seqs130": ({"max_num_seqs": 130}, ("PIECEWISE", "PIECEWISE"), 256),
    "budget300": ({"max_num_batched_tokens": 300}, ("PIECEWISE", "PIECEWISE"), 300),
    "x300": ({"max_cudagraph_capture_size": 300}, ("PIECEWISE", "PIECEWISE"), 288),
    "sizes": ({"cudagraph_capture_sizes": (1, 2, 4, 8, 16, 32, 64)}, ("PIECEWISE",) * 2, 64),
    "spec2": ({"cudagraph_mode": "FULL_AND_PIECEWISE", "max_num_seqs": 256,
               "speculative": Speculative(method="deepseek_mtp", num_spec_tokens=2)},
              ("FULL", "PIECEWISE"), 504),
}


@functools.cache
def _graph_batch():
    return batch({k: variant(inputs(DS3), engine=v[0]) for k, v in GRAPH_CASES.items()})


@pytest.mark.parametrize("key", list(GRAPH_CASES))
def test_graph_modes_and_capture_tokens(key):  # model.md §9.5 table, §9.6 worked examples
    changes, modes, tokens = GRAPH_CASES[key]
    (row,) = query(_graph_batch(), "SELECT * FROM pool_engine WHERE scenario = ?", key)
    assert (row["decode_graph_mode"], row["other_graph_mode"]) == modes
    assert row["capture_tokens"] == tokens
    if row["captures_graphs"]:  # the SQL agrees with the pure law (kernel.model.laws)
        assert row["capture_tokens"] == max(laws.capture_sizes(
            row["resolved_max_num_seqs"], row["uniform_decode_width"],
            row["resolved_max_num_batched_tokens"], changes.get("max_cudagraph_capture_size"),
            changes.get("cudagraph_capture_sizes"), False, row["decode_graph_mode"] == "FULL"))
    names = [r["name"] for r in query(_graph_batch(), "SELECT name FROM pool_assumptions "
                                      "WHERE scenario = ?", key)]
    stated_capture = ("max_cudagraph_capture_size" in changes
                      or "cudagraph_capture_sizes" in changes)
    assert ("max_cudagraph_capture_size" in names) == (tokens > 0 and not stated_capture)


def test_blackwell_capture_ceiling_and_deepep_ht():  # model.md §9.6 B200 example, §9.5 rule 7
    inp = inputs(DS3)
    bw = variant(replace(inp, chip=replace(inp.chip, tflops_nvfp4=4500.0)),
                 engine={"max_num_seqs": 256, "cudagraph_mode": "",
                         "speculative": Speculative(method="deepseek_mtp", num_spec_tokens=3)})
    con = batch({"bw": bw})
    (row,) = query(con, "SELECT capture_tokens FROM pool_engine")
    assert row["capture_tokens"] == 1024
    ht = widened_collectives(variant(inputs(MM25_EP16), parallel={"tp": 8, "dp": 2},
                                     engine={"all2all_backend": "deepep_high_throughput"}))
    r, res = build.resolve(ht)
    assert (r.decode_graph_mode, r.other_graph_mode, r.capture_tokens) == ("NONE", "NONE", 0)
    (ov,) = [o for o in res.overrides if o.field == "cudagraph_mode"]
    assert (ov.requested, ov.resolved) == ("PIECEWISE", "NONE")


def test_max_num_seqs_default_by_chip():  # model.md §9.5 defaultMaxNumSeqs, case 110
    r, _ = build.resolve(variant(inputs(NEMOTRON), engine={"max_num_seqs": 0}))
    assert r.max_num_seqs == 1024  # h100, 80 GiB
    assert assumption(r, "max_num_seqs").scope.startswith("1024: ")
