"""Every refusal of model.md §10: one variant each (cases: model.md §14.3).

Each variant is an embedded scenario with one field changed (dataclasses.replace); the test
asserts that ``new()`` refuses it with a message naming the setting and the value (or, for a
condition field validation rejects first, that the refusal row of the SQL views does).
Spec case numbers are cited per test.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from kernel.facade import factory
from kernel.pool import build
from pipeline.errors import RefusalError
from tests.resolution_support import (
    DS3,
    GLM5,
    GPTOSS,
    KIMI,
    MM25,
    MM25_EP16,
    entry,
    first_refusals,
    inputs,
    nodes,
    refusal,
    variant,
    widened_collectives,
    with_entries,
    without,
)


def refuses(inp, setting: str, *needles: str) -> RefusalError:
    with pytest.raises(RefusalError) as info:
        factory.new(inp)
    err = info.value
    assert err.setting == setting, str(err)
    text = str(err)
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"
    return err


def starts(inp) -> None:
    build.resolve(inp)


# -- steps 1–3: inputs ------------------------------------------------------------------


def test_nil_documents_refused():
    with pytest.raises(RefusalError, match="needs a scenario, a deployment, a model graph"):
        factory.new(replace(inputs(DS3), model=None))  # type: ignore[arg-type]
    with pytest.raises(RefusalError, match="chip"):
        factory.new(replace(inputs(DS3), chip=None))  # type: ignore[arg-type]


def test_pool_index_out_of_range():
    err = refuses(replace(inputs(DS3), pool_index=3), "pool_index",
                  "pool index 3 is outside the deployment's 1 pool(s)")
    assert err.value == 3


def test_no_rules():
    refuses(replace(inputs(DS3), rules=None), "engine_version",  # type: ignore[arg-type]
            "needs engine rules for version '0.29.0'")


# -- step 7/8: layout and scope ----------------------------------------------------------


def test_tp_below_one_refused_by_layout():
    row = refusal(variant(inputs(DS3), parallel={"tp": 0}))
    assert row is not None and row["setting"] == "tp" and row["value"] == "0"
    assert "tensor- and data-parallel widths must be at least 1" in row["reason"]


def test_no_coefficient_in_scope():
    base = inputs(DS3)
    sets = tuple(replace(c, coefficients=tuple(
        replace(e, scope=replace(e.scope, hardware=(f"other-part-{i}",)))
        for i, e in enumerate(c.coefficients))) for c in base.coefficients)
    inp = replace(base, coefficients=sets)
    refuses(inp, "coefficients", "no coefficient in the listed sets applies to hardware=h200",
            "model=deepseek-v3", "tp=8", "ep=1", "nodes_spanned=1")


# -- steps 10–11: dtypes (cases 129–132) ----------------------------------------------------


def test_unknown_quantization():
    refuses(variant(inputs(DS3), engine={"quantization": "bogus_q"}), "quantization",
            "'bogus_q'", "not one this kernel prices")


CACHE_REFUSALS = [
    ("bogus", "is not a vLLM v0.31.0 cache dtype"),
    ("int8_per_token_head", "does not price"),
    ("turboquant_k8v4", "does not price"),
    ("fp8_inc", "served by no CUDA attention backend"),
    ("fp8_ds_mla", "served only by the sparse-MLA backends"),
    ("nvfp4", "refuses plain nvfp4 with MLA"),
]
CACHE_STARTS = [(DS3, "fp8_e5m2"), (MM25, "nvfp4"), (GLM5, "fp8_ds_mla")]


@functools.cache
def _cache_batch():
    variants = {f"ds3-{c}": variant(inputs(DS3), engine={"cache_dtype": c})
                for c, _ in CACHE_REFUSALS}
    variants.update({f"{n}-{c}": variant(inputs(n), engine={"cache_dtype": c})
                     for n, c in CACHE_STARTS})
    return first_refusals(variants)


@pytest.mark.parametrize("cache, needle", CACHE_REFUSALS)
def test_cache_dtype_refusals_ds3(cache, needle):  # cases 129, 131, 132
    row = _cache_batch()[f"ds3-{cache}"]
    assert row is not None and row["setting"] == "cache_dtype" and row["value"] == cache
    assert needle in row["reason"]


def test_cache_dtype_refusal_via_new():
    refuses(variant(inputs(DS3), engine={"cache_dtype": "fp8_inc"}), "cache_dtype", "fp8_inc",
            "served by no CUDA attention backend")


@pytest.mark.parametrize("name, cache", CACHE_STARTS)
def test_cache_dtypes_that_start(name, cache):  # cases 129, 131, 132
    assert _cache_batch()[f"{name}-{cache}"] is None


def test_mamba_state_dtype():  # case 130
    starts(variant(inputs(DS3), engine={"mamba_cache_dtype": "float32"}))
    refuses(variant(inputs(DS3), engine={"mamba_cache_dtype": "fp8"}), "mamba_cache_dtype",
            "'fp8'", "not a vLLM v0.31.0 recurrent state dtype")


# -- step 13: pipeline parallelism (case 128) ---------------------------------------------


def test_pipeline_parallel_refused_and_tp16_starts():
    pp2 = nodes(variant(inputs(DS3), parallel={"pp": 2}), 2)
    refuses(pp2, "pp", "pipeline parallelism (pp 2) is not priced")
    # tp16 over two nodes starts once the registry measures 16-rank collectives on the part
    # (the embedded h200 sweep stops at 8 ranks; see test_collective_width_inside_sweep).
    tp16 = nodes(variant(inputs(DS3), parallel={"tp": 16}), 2)
    starts(widened_collectives(tp16))


# -- step 16: DSA block size (cases 121, 122) -----------------------------------------------


@pytest.mark.parametrize("block", [16, 32])
def test_dsa_block_not_multiple_of_64(block):
    refuses(variant(inputs(GLM5), engine={"block_size": block}), "block_size", str(block),
            "64-token kernel blocks")


def test_dsa_block_128_starts():
    starts(variant(inputs(GLM5), engine={"block_size": 128}))


# -- step 17: context parallelism (cases 141, 142) --------------------------------------------


def test_pcp_with_non_latent_attention():
    inp = nodes(variant(inputs(GPTOSS), parallel={"pcp": 2}), 2)
    refuses(inp, "pcp", "prefill-context parallelism (pcp 2)", "attention")


def test_pcp_with_recurrent_layer():
    inp = nodes(variant(inputs(KIMI), parallel={"pcp": 2}), 2)
    refuses(inp, "pcp", "pcp 2", "recurrent mixer")


def test_pcp_and_dcp_on_plain_mla():
    inp = nodes(variant(inputs(DS3), parallel={"pcp": 2, "dcp": 2}), 2)
    refuses(inp, "pcp", "pcp 2, dcp 2", "DSA sparse-MLA")


def test_dcp_q_replicate_on_latent():
    refuses(variant(inputs(DS3), parallel={"dcp": 8}, engine={"dcp_q_replicate": True}),
            "dcp_q_replicate", "dcp 8")
    starts(variant(inputs(DS3), parallel={"dcp": 8}, engine={"dcp_q_replicate": False}))
    starts(variant(inputs(DS3), engine={"dcp_q_replicate": True}))  # dcp off
    starts(variant(inputs(MM25), parallel={"dcp": 8}, engine={"dcp_q_replicate": True}))


@pytest.mark.parametrize("dcp", [1, 8])
def test_dcp_backend_not_priced(dcp):
    refuses(variant(inputs(DS3), parallel={"dcp": dcp},
                    engine={"dcp_comm_backend": "all_gather_only"}),
            "dcp_comm_backend", "all_gather_only")


def test_dcp_backend_not_in_pack():
    base = variant(inputs(DS3), parallel={"dcp": 8}, engine={"dcp_comm_backend": "a2a"})
    pack = replace(base.rules, version="0.29.0-test", dcp_comm_backends=("ag_rs",))
    refuses(replace(base, rules=pack), "dcp_comm_backend", "'a2a'", "not one the rules pack")


def test_a2a_with_pcp_refused_ag_rs_starts():
    base = variant(inputs(GLM5), parallel={"tp": 2, "pcp": 4, "dcp": 4},
                   engine={"dcp_comm_backend": "a2a"})
    err = refuses(base, "dcp_comm_backend", "a2a")
    assert "pcp 4" in str(err)
    starts(variant(base, engine={"dcp_comm_backend": "ag_rs"}))


def test_interleave_misfit_and_multiconnector():
    base = variant(inputs(DS3), parallel={"dcp": 8})
    refuses(variant(base, engine={"cp_kv_cache_interleave_size": 32}),
            "cp_kv_cache_interleave_size", "32", "does not fit block_size 16")
    refuses(variant(base, engine={"cp_kv_cache_interleave_size": 3}),
            "cp_kv_cache_interleave_size", "'3'")
    multi = replace(inputs(DS3).deployment.pd_transfer or _pd(), connector="MultiConnector")
    refuses(variant(base, deployment={"pd_transfer": multi}), "cp_kv_cache_interleave_size",
            "unstated", "MultiConnector")
    nixl = replace(multi, connector="NixlConnector")
    starts(variant(base, engine={"cp_kv_cache_interleave_size": 32},
                   deployment={"pd_transfer": nixl}))


def _pd():
    from pipeline.documents import PDTransfer
    return PDTransfer(connector="NixlConnector")


def test_interleave_with_assumed_block_not_confirmable():
    base = variant(inputs(MM25), parallel={"dcp": 2},
                   engine={"block_size": 0, "cp_kv_cache_interleave_size": 32})
    refuses(base, "cp_kv_cache_interleave_size", "not confirmable")


# -- step 18: lift ---------------------------------------------------------------------------


def test_hbm_bandwidth_zero():
    row = refusal(replace(inputs(DS3), chip=replace(inputs(DS3).chip, bw_peak_tbs=0.0)))
    assert row is not None and row["setting"] == "hbm_bps"
    assert "HBM bandwidth resolved to 0" in row["reason"]
    assert "cannot price anything" in row["reason"]


def test_compute_peak_zero():
    chip = replace(inputs(DS3).chip, tflops_fp8=0.0, tflops_peak=0.0)
    row = refusal(replace(inputs(DS3), chip=chip))
    assert row is not None and row["setting"] == "peak_flops"
    assert "compute peak resolved to 0" in row["reason"]


def test_missing_hbm_derate():
    refuses(without(inputs(DS3), lambda e: e.name == "hbm_derate"), "hbm_derate",
            "'hbm_derate' is not in the resolved set; available:")


def test_missing_gemm_envelope():
    refuses(without(inputs(DS3), lambda e: e.name == "gemm_eps_max_fp8"), "gemm_eps_max_fp8",
            "no efficiency asymptote / half-max for served dtype fp8")


def test_only_one_gemm_shape_half():
    inp = with_entries(inputs(DS3), [entry("gemm_n_half_fp8", 3072, hardware=("h200",), units="tokens")])
    refuses(inp, "gemm_n_half_fp8", "one of gemm_n_half/gemm_k_half but not both")


def test_unknown_cudagraph_mode():
    refuses(variant(inputs(DS3), engine={"cudagraph_mode": "SOMETIMES"}), "cudagraph_mode",
            "SOMETIMES", "not one this kernel prices")


def test_ep_width_exceeds_experts():
    inp = inputs(MM25)
    kinds = tuple(replace(k, nodes=tuple(replace(n, experts=8) if n.op == "GroupedGEMM" else n
                                         for n in k.nodes)) for k in inp.model.layer_kinds)
    small = replace(inp.model, name="minimax-small-experts", layer_kinds=kinds)
    base = nodes(variant(replace(inp, model=small),
                         parallel={"tp": 8, "dp": 2, "enable_expert_parallel": True}), 2)
    refuses(widened_collectives(base), "ep", "expert-parallel width 16 exceeds the model's 8")


def test_missing_memory_set():  # case 114
    inp = inputs(DS3)
    scen = replace(inp.scenario, coefficients=tuple(s for s in inp.scenario.coefficients
                                                   if s != "cost-model-memory"))
    inp = replace(inp, scenario=scen, coefficients=tuple(s for s in inp.coefficients
                                                         if s.name != "cost-model-memory"))
    # liftMemory order: communicator, workspace, capture bytes, activation buffers, floor
    err = refuses(inp, "cudagraph_capture_bytes_piecewise", "cost-model-memory")
    assert "memory occupancy needs" in str(err)


def test_collective_width_inside_sweep():  # cases 85, 144 (h200 sweep is [2 4 8])
    off = replace(inputs(MM25_EP16), assumed_collective_widths=False)
    refuses(off, "collective_width", "no 16-rank all_reduce measurement for h200", "[2 4 8]",
            "turned off")
    starts(inputs(MM25_EP16))  # the assumed extension (on by default) prices it


def test_no_collective_widths_at_all():
    inp = without(inputs(DS3), lambda e: e.name.startswith("collective_floor_alltoall"))
    refuses(inp, "collective_width", "no measured alltoall widths at all")


def test_collective_triple_member_missing():
    # drop the 8-rank all_gather transition rate: 8 is no longer measured, and 8 is inside the
    # sweep, so the width cannot be borrowed from 4 (case 88 measuredWidths semantics)
    inp = without(inputs(DS3),
                  lambda e: e.name == "collective_transition_rate_all_gather_fp16_8rank_h200")
    refuses(inp, "collective_width", "no 8-rank all_gather measurement", "[2 4]")


# -- DSA backend (cases 77–82, 125, 133) -----------------------------------------------------


def _glm5(tp: int, pcp: int, dcp: int, cache: str, blackwell: bool):
    inp = inputs(GLM5)
    chip = replace(inp.chip, tflops_nvfp4=4500.0) if blackwell else inp.chip
    inp = variant(replace(inp, chip=chip), parallel={"tp": tp, "pcp": pcp, "dcp": dcp},
                  engine={"cache_dtype": cache})
    return nodes(inp, max(1, tp * pcp // 8))


DSA_TABLE = [
    (4, 1, 2, "fp8", False, True),
    (2, 1, 2, "fp8", False, False),
    (8, 1, 2, "fp8_e4m3", False, False),
    (4, 1, 2, "auto", False, False),
    (4, 1, 2, "bfloat16", False, False),
    (8, 1, 1, "fp8_e4m3", False, True),
    (8, 1, 1, "auto", False, True),
    (8, 1, 1, "nvfp4_ds_mla", False, False),
    (8, 1, 1, "nvfp4_ds_mla", True, True),
    (2, 4, 4, "fp8", True, True),
    (2, 4, 4, "bfloat16", True, False),
    (2, 1, 2, "fp8", True, True),
    (4, 1, 2, "auto", True, True),
    (2, 1, 2, "auto", True, False),
    (4, 1, 8, "fp8", False, False),   # case 77: 16 local heads pad to 64, 128 gathered to 128
    (8, 1, 4, "fp8", False, True),    # case 78
    (8, 2, 2, "fp8", False, True),    # case 80
    (8, 1, 1, "fp8_e5m2", False, False),  # case 82
]


def _dsa_key(case) -> str:
    return "glm5-" + "-".join(str(x) for x in case[:5])


@functools.cache
def _dsa_batch(blackwell: bool):
    return first_refusals({_dsa_key(c): _glm5(*c[:5]) for c in DSA_TABLE if c[4] == blackwell})


@pytest.mark.parametrize("case", DSA_TABLE, ids=_dsa_key)
def test_sparse_mla_backend_table(case):  # case 125
    row = _dsa_batch(case[4])[_dsa_key(case)]
    if case[5]:
        assert row is None, row
    else:
        assert row is not None and row["setting"] == "cache_dtype", row
        assert case[3] in row["value"]


def test_sparse_mla_refusal_message_via_new():
    refuses(_glm5(8, 1, 1, "fp8_e5m2", False), "cache_dtype",
            "no sparse-MLA backend in vLLM v0.31.0 serves a 'fp8_e5m2' cache with dcp 1, pcp 1")


def test_a2a_with_flashmla_dcp_refused():  # case 81
    inp = variant(_glm5(8, 1, 2, "fp8", False), engine={"dcp_comm_backend": "a2a"})
    row = refusal(inp)
    assert row is not None and "combines only with ag_rs" in row["reason"]


def test_pre_hopper_part():  # case 133
    def renamed(name: str, chip: str):
        inp = inputs(name)
        entries = []
        for cset in inp.coefficients:  # rescope the h200 figures to the renamed part
            entries += [replace(e, scope=replace(e.scope, hardware=(chip,)))
                        for e in cset.coefficients if "h200" in e.scope.hardware]
        entries = [replace(e, name=e.name.replace("_h200", "_" + chip)) for e in entries]
        # one entry per name, the last (a later set wins: the measured layer's over the scenario's)
        entries = list({e.name: e for e in entries}.values())
        return with_entries(replace(inp, chip=replace(inp.chip, name=chip),
                                    scenario=replace(inp.scenario, cluster=replace(
                                        inp.scenario.cluster, hardware=chip))), entries)
    starts(renamed(DS3, "l40s"))
    refuses(renamed(GLM5, "l40s"), "cache_dtype", "needs a Hopper or newer part", "l40s")
    starts(renamed(GLM5, "h200"))
