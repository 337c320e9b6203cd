"""StepTime term by term on hand-built pools (model.md §1–§5).

Each expected value is written out from the spec's formula with the fixture's round
coefficients (tests/fixtures_pools.py), independently of kernel/model/step.py.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from kernel.model import laws, step
from kernel.model.resolved import PlannedAttention
from kernel.model.types import MAX_DURATION_NS, Batch, Resource, StepEstimate
from tests.fixtures_pools import (
    dense_layer,
    make_pool,
    mla_layer,
    replace,
    replace_coeffs,
    tiny_dense,
    tiny_hybrid,
    tiny_moe_mla,
    tiny_pcp,
)

REL = 1e-12


def totals(r, batch):  # noqa: ANN001, ANN201
    return step.compose(r, step.summarise(r, batch))


def price(r, batch) -> StepEstimate:  # noqa: ANN001
    return step.step_time_into(r, batch, {})


def decode(n: int, ctx: int, q: int = 1, thr: int = 8, sm_budget: int = 0) -> Batch:
    return Batch([(q, ctx - q)] * n, decode_threshold=thr, sm_budget=sm_budget)


# --- the dense reference: every resource by hand ------------------------------------------


def dense_decode_expected(n: int, ctx: int) -> dict[str, float]:
    """tiny_dense, n decodes at context ctx, by model.md §1.3/§1.4 with tp 1, 4 layers."""
    T = float(n)
    ramp = 0.8 * T / (T + 100.0)
    pr = 1e15 * ramp
    flops = T * (2 * 1536 * 1024 + 2 * 1024 * 1024) / 1.0
    weight = (1536 * 1024 + 1024 * 1024) * 2.0 / 1.0
    per_layer_kv = 2 * 2 * 128 * 2.0 * 4 / 4
    attn = 10e-6 + (n * ctx) * per_layer_kv / 1e12
    elementwise = T * 4096.0 / 1.0
    sm = flops / pr * 1.0
    hbm = (weight + 0.0 + elementwise) / 1e12 + attn
    nbytes = T * 2048.0
    nv = max(10e-6 + nbytes / 50e9, nbytes / 100e9)
    stage = max(sm, hbm, nv, 0.0)
    head_sm = T * (2 * 32000 * 1024) / 1.0 / pr
    head_hbm = 32000 * 1024 * 2.0 / 1.0 / 1e12
    return {"sm": 4 * sm + head_sm, "hbm": 4 * hbm + head_hbm, "nvlink": 4 * nv,
            "overlap": 4 * stage + max(head_sm, head_hbm)}


@pytest.mark.parametrize(("n", "ctx"), [(1, 100), (4, 101), (32, 4096), (256, 8192)])
def test_dense_decode_every_resource_by_hand(n: int, ctx: int) -> None:
    r = tiny_dense()
    t = totals(r, decode(n, ctx))
    exp = dense_decode_expected(n, ctx)
    assert t.sm_s == pytest.approx(exp["sm"], rel=REL)
    assert t.hbm_s == pytest.approx(exp["hbm"], rel=REL)
    assert t.nvlink_s == pytest.approx(exp["nvlink"], rel=REL)
    assert t.nic_s == 0.0
    assert t.overlap_s == pytest.approx(exp["overlap"], rel=REL)
    # uniform decode under FULL: one replay (5 µs) + 1 µs per kernel x (4·6 + 2)
    assert t.host_ns == 5_000 + 26 * 1_000


def test_dense_decode_exact_nanoseconds() -> None:
    """4 decodes at ctx 101: per-resource ns, NoOverlap sum, bottleneck, Overlap."""
    est = price(tiny_dense(), decode(4, 101))
    exp = dense_decode_expected(4, 101)
    sm, hbm, nv = (laws.to_duration_ns(exp[k]) for k in ("sm", "hbm", "nvlink"))
    assert est.per_resource == {Resource.SM: sm, Resource.HBM: hbm, Resource.NVLINK: nv,
                                Resource.HOST: 31_000}
    assert est.no_overlap == sm + hbm + nv + 31_000
    assert est.bottleneck is Resource.HBM
    assert est.overlap == laws.to_duration_ns(exp["overlap"]) + 31_000


# --- prefill attention ---------------------------------------------------------------------


def test_prefill_attention_term_on_sm() -> None:
    """One 512-token prefill: attnSM = prefill floor + causal·Q·D/tp / (peak·ε(T)·scale)."""
    r = tiny_dense()
    base = totals(replace_coeffs(r, attention_prefill_scale=0.0, attention_prefill_floor_ns=0),
                  Batch([(512, 0)]))
    t = totals(r, Batch([(512, 0)]))
    T = 512.0
    causal = 4 * (T * 0 + T * T * 0.5)
    ramp = 0.8 * T / (T + 100.0)
    attn_sm = 20e-6 + causal * 8 * 128 / 1.0 / (1e15 * (ramp * 0.5)) * 1.0
    fallback = causal * 8 * 128 / 1.0 / (1e15 * ramp)  # scale 0: the plain ramp, no floor
    assert t.sm_s - base.sm_s == pytest.approx(4 * (attn_sm - fallback), rel=1e-9)


def test_mixed_batch_one_kernel_rule_drops_decode_floor() -> None:
    """FlashAttention varlen: gqa, dcp 1, no NVFP4, decode floor (10 µs) < prefill floor
    (20 µs) → the decode floor is not charged on a mixed batch (model.md §3.4)."""
    r = tiny_dense()
    mixed = Batch([(512, 0), (1, 100)])
    t = totals(r, mixed)
    no_rule = totals(replace(r, chip_nvfp4_tflops=1.0), mixed)  # NVFP4 part: both floors
    assert no_rule.hbm_s - t.hbm_s == pytest.approx(4 * 10e-6, rel=1e-9)
    assert no_rule.sm_s == t.sm_s


def test_mixed_batch_one_kernel_rule_drops_prefill_floor_when_decode_floor_larger() -> None:
    r = replace_coeffs(tiny_dense(), attention_floor_ns=30_000)
    mixed = Batch([(512, 0), (1, 100)])
    t = totals(r, mixed)
    no_rule = totals(replace(r, chip_nvfp4_tflops=1.0), mixed)
    assert no_rule.sm_s - t.sm_s == pytest.approx(4 * 20e-6, rel=1e-9)
    assert no_rule.hbm_s == t.hbm_s


def test_latent_mixed_batch_charges_both_floors() -> None:
    """MLA is not a one-kernel backend: prefill and decode floors both charged (kept)."""
    r = tiny_moe_mla(dcp=1)
    mixed = Batch([(512, 0), (1, 100)])
    t = totals(r, mixed)
    t2 = totals(replace(r, chip_nvfp4_tflops=1.0), mixed)
    assert (t.sm_s, t.hbm_s) == (t2.sm_s, t2.hbm_s)


def test_no_decode_rate_falls_back_to_hbm_bytes() -> None:
    """attention_decode_rate absent: kvBytes = n·κ/L_kv at HBM bandwidth, no floor."""
    r = tiny_dense()
    t = totals(replace_coeffs(r, attention_rate_bps=0.0), decode(4, 101))
    exp = dense_decode_expected(4, 101)
    attn = 10e-6 + 404 * 1024.0 / 1e12
    fallback = 404 * 1024.0 / 1e12
    assert t.hbm_s == pytest.approx(exp["hbm"] - 4 * attn + 4 * fallback, rel=1e-12)


def test_kind_rate_overrides_part_wide() -> None:
    """mla has its own (12 µs, 2e12 B/s) pair in the fixture."""
    r = tiny_moe_mla(dcp=1)
    a = totals(r, decode(1, 1001))
    b = totals(r, decode(1, 2001))
    assert b.hbm_s - a.hbm_s == pytest.approx(6 * 1000 * 576.0 / 2e12, rel=1e-9)


# --- SM derate, host modes ---------------------------------------------------------------


def test_sm_budget_derates_sm_terms() -> None:
    """SMBudget 66 of 132 SMs → SM terms × 2; HBM untouched (model.md §2.5)."""
    r = tiny_dense()
    full = totals(r, decode(4, 101))
    half = totals(r, decode(4, 101, sm_budget=66))
    assert half.sm_s == pytest.approx(2 * full.sm_s, rel=1e-12)
    assert half.hbm_s == full.hbm_s
    assert totals(r, decode(4, 101, sm_budget=200)).sm_s == full.sm_s


def test_host_modes() -> None:
    """FULL for uniform decodes, PIECEWISE (× segments) otherwise, eager above capture."""
    r = tiny_dense()
    launch = 26 * 1_000
    assert totals(r, decode(4, 101)).host_ns == 5_000 + launch
    assert totals(r, Batch([(1, 100), (2, 100)])).host_ns == 5_000 * 5 + launch
    assert totals(r, Batch([(513, 0)])).host_ns == 30_000 * 4 + launch  # > capture 512
    assert totals(r, decode(512, 1000)).host_ns == 5_000 + launch  # == capture: graphs


def test_empty_step_is_host_only() -> None:
    """model.md §1.5: Tokens() == 0 → host without the launch term; bottleneck host."""
    r = tiny_dense()
    est = price(r, Batch([]))
    assert est == StepEstimate(5_000, 5_000, Resource.HOST, {Resource.HOST: 5_000})
    est = price(r, Batch([(0, 0), (0, 5)]))  # non-empty, not uniform: PIECEWISE
    assert est == StepEstimate(25_000, 25_000, Resource.HOST, {Resource.HOST: 25_000})
    zero = replace_coeffs(r, host_replay_graph_per_step_ns=0)
    assert price(zero, Batch([])).per_resource == {Resource.HOST: 0}


def test_per_none_gives_no_map_and_clears_callers_map() -> None:
    r = tiny_dense()
    assert step.step_time_into(r, decode(2, 10), None).per_resource is None
    mine = {Resource.NIC: 5}
    est = step.step_time_into(r, decode(2, 10), mine)
    assert est.per_resource is mine and Resource.NIC not in mine


# --- experts -------------------------------------------------------------------------------


def test_routed_experts_not_divided_by_tp() -> None:
    """The documented over-charge: routed FLOPs per rank = T·topK·share·EF·imb / dpSlice,
    dpSlice = expertTensorShards/tp = 1 here; tp (2) does not divide it (model.md §4.2)."""
    r = tiny_moe_mla(dcp=1)
    s = step.summarise(r, decode(8, 100))
    trace: list[dict[str, float]] = []
    step._compose(step.prepared(r), s, trace)
    T = 8.0
    ramp = 0.8 * T / (T + 100.0)
    routed = T * 1.0 * 2 * 1.0 * (2 * 3 * 512 * 1024) * 1.25 / 1.0
    assert trace[0]["routed_sm"] == pytest.approx(routed / (1e15 * ramp), rel=1e-12)
    touched = 16 * (1 - (14 / 16) ** 8)
    assert trace[0]["routed_hbm"] == pytest.approx(3 * 512 * 1024 / 2 * touched / 1e12,
                                                   rel=1e-12)


def test_routed_terms_add_outside_the_stage_max() -> None:
    r = tiny_moe_mla(dcp=1)
    s = step.summarise(r, decode(8, 100))
    trace: list[dict[str, float]] = []
    t = step._compose(step.prepared(r), s, trace)
    row = trace[0]
    stage = max(row["dense_sm"], row["dense_hbm"], row["nvlink"], row["nic"]) \
        + (row["routed_sm"] + row["routed_hbm"])
    assert row["stage"] == pytest.approx(stage, rel=1e-15)
    assert t.overlap_s > 6 * (row["routed_sm"] + row["routed_hbm"])


# --- DCP ---------------------------------------------------------------------------------


def test_dcp_decode_read_is_the_busiest_shard() -> None:
    """dcp 2: each ctx-101 decode reads ceil(101/2) = 51 tokens (model.md §3.7)."""
    r = tiny_moe_mla(dcp=2)
    s = step.summarise(r, decode(3, 101))
    assert s.decode_reads == (153.0,)
    assert s.decode_kv_tokens == 303


def test_dcp_decode_collectives_ag_rs() -> None:
    """AG(dcp) of r·(H/tp·dcp)·qW·2, AG(dcp) LSE dcp·r·A·4, RS(dcp) r·A·oW·2 per layer."""
    r = tiny_moe_mla(dcp=2)
    r1 = replace(r, collectives={k: v for k, v in r.collectives.items() if k[1] != "dcp"},
                 layout=dataclasses.replace(r.layout, dcp=1))
    t2 = totals(r, decode(4, 101))
    t1 = totals(r1, decode(4, 101))
    rows, A = 4.0, 16 / 2.0 * 2

    def ct(b: float, floor: float) -> float:
        return max(floor + b / 50e9, b / 100e9)

    extra = (ct(rows * A * 576.0 * 2, 8e-6) + ct(2 * rows * A * 4, 8e-6)
             + ct(rows * A * 512.0 * 2, 6e-6))
    assert t2.nvlink_s - t1.nvlink_s == pytest.approx(6 * extra, rel=1e-9)


def test_dcp_decode_collectives_a2a() -> None:
    r = tiny_moe_mla(dcp=2, backend="a2a")
    r_rs = tiny_moe_mla(dcp=2)
    b = decode(4, 101)
    rows, A = 4.0, 16.0

    def ct(x: float, floor: float) -> float:
        return max(floor + x / 50e9, x / 100e9)

    a2a = ct(rows * A * (512.0 + 2) * 2, 9e-6)
    rs = ct(2 * rows * A * 4, 8e-6) + ct(rows * A * 512.0 * 2, 6e-6)
    assert totals(r, b).nvlink_s - totals(r_rs, b).nvlink_s == pytest.approx(
        6 * (a2a - rs), rel=1e-9)


def test_dcp_prefill_context_gathers() -> None:
    """Latent + dcp: runs of computed context (sorted by scheduled, split at computed 0) are
    gathered in ceil(C/chunk) launches of C·2·headDim/chunks bytes (model.md §3.7)."""
    r = tiny_moe_mla(dcp=2)  # mla_context_chunk 4096
    b = Batch([(300, 6000), (100, 0), (200, 4000), (50, 1000)], decode_threshold=8)
    s = step.summarise(r, b)
    # sorted by scheduled: (50,1000) (100,0) (200,4000) (300,6000) → runs 1000, 10000
    assert s.context_runs == (1000, 10000)
    no_ctx = Batch([(300, 0), (100, 0), (200, 0), (50, 0)], decode_threshold=8)
    assert step.summarise(r, no_ctx).context_runs == ()


def test_dcp_context_gather_charge() -> None:
    r = tiny_moe_mla(dcp=2)
    p = step.prepared(r)
    layer = p.layers[0]
    on, cross = step._context_gathers(p, layer, (1000, 10000), True, 0.0, 0.0)

    def ct(x: float) -> float:
        return max(8e-6 + x / 50e9, x / 100e9)

    exp = ct(1000 * 1152.0 / 1)
    for _ in range(3):  # ceil(10000/4096) = 3 launches
        exp = exp + ct(10000 * 1152.0 / 3)
    assert on == exp and cross == 0.0


# --- PCP ---------------------------------------------------------------------------------


def test_pcp_withholds_tokens_and_gathers_over_nic() -> None:
    """pcp 2, one 1000-token prefill: the busiest rank holds 500 (zigzag of 4 chunks of 250),
    T = 500; the PCP gather crosses nodes (span 1.5) → NIC (model.md §3.8 pcpPrefillGathers)."""
    r = tiny_pcp(pcp=2)
    s = step.summarise(r, Batch([(1000, 0)]))
    assert (s.tokens_all, s.withheld, s.prefill_tokens) == (1000, 500, 500)
    assert s.causal_flops == laws.pcp_causal_pairs(1000, 0, 2, 1)
    t = step.compose(r, s)
    rows = 2 * 500

    def ct(x: float) -> float:
        return max(11e-6 + x / 50e9, x / 100e9)

    per_layer = ct(rows * 512 * 2 * 1.5) + ct(rows * 64 * 2 * 1.5)  # lora 512, rope 64
    assert t.nic_s == pytest.approx(6 * per_layer, rel=1e-12)
    assert totals(r, decode(4, 100)).nic_s == 0.0  # decodes: no PCP gather


# --- hybrid, windows, secondary attention --------------------------------------------------


def test_recurrent_term_and_kv_layers_divisor() -> None:
    """mamba2: floor 15 µs + T/rate on SM per layer; decode KV share is κ/kv_layers
    (2 attention layers of 8), the decided divisor (model.md §3.2, case 115)."""
    r = tiny_hybrid()
    a = totals(r, decode(1, 4096))
    b = totals(r, decode(1, 8192))
    assert b.hbm_s - a.hbm_s == pytest.approx(2 * 4096 * (1024.0 * 2 / 2) / 1e12, rel=1e-9)
    no_rec = totals(replace_coeffs(r, recurrent={}), decode(1, 4096))
    assert a.sm_s - no_rec.sm_s == pytest.approx(6 * (15e-6 + 1.0 / 2e6), rel=1e-9)


def test_windowed_layer_uses_windowed_causal_flops() -> None:
    r = make_pool(layers=(dense_layer(attn_window=128),))
    s = step.summarise(r, Batch([(512, 1000), (300, 0)]))
    assert s.windowed == (laws.windowed_causal_flops([(512, 1000), (300, 0)], 128),)
    assert s.causal_flops == laws.causal_pairs(512, 1000) + laws.causal_pairs(300, 0)


def test_secondary_attention_reads_hbm_on_decode() -> None:
    """A cache-less scorer (role set) reads κ/L_kv·(kvH·hd/primary) per token, windowed by
    Window·decodeRequests and compressed by its ratio (model.md §3.3 secondary)."""
    scorer = PlannedAttention(4, 1, 128, "gqa", 64, "block_index_scores", 2)
    layer = dense_layer(attentions=(PlannedAttention(8, 2, 128, "gqa", 0, "", 0), scorer))
    r = make_pool(layers=(layer,))
    base = totals(tiny_dense(), decode(2, 1000))
    t = totals(r, decode(2, 1000))
    n = min(2000.0, 64 * 2) / 2
    per_tok = 1024.0 * (1 * 128 / (2 * 128))
    assert t.hbm_s - base.hbm_s == pytest.approx(4 * (10e-6 + n * per_tok / 1e12), rel=1e-9)
    assert totals(r, Batch([(512, 0)])).hbm_s == totals(tiny_dense(), Batch([(512, 0)])).hbm_s


def test_sparse_mla_decode_read_uses_selection() -> None:
    """sparse_mla with index top-k 256: each decode reads min(ctx, 256) (model.md §3.6)."""
    layer = mla_layer(attn_kind="sparse_mla", attn_index_top_k=256,
                      attentions=(PlannedAttention(16, 1, 576, "sparse_mla", 0, "", 0),))
    r = tiny_moe_mla(dcp=1, layers=(layer,))
    s = step.summarise(r, decode(3, 1000))
    assert s.decode_reads == (3 * 256.0,)
    a, b = totals(r, decode(3, 1000)), totals(r, decode(3, 5000))
    assert a.hbm_s == b.hbm_s  # past the top-k the read no longer grows


# --- collective metamorphic, finish --------------------------------------------------------


def test_collective_floor_times_ten_adds_nine_t0_per_launch() -> None:
    """model.md §14.6: ×10 on the TP all-reduce floor moves NoOverlap by 9·t0 per launch
    (4 layers × 1 launch) while the floor binds."""
    r = tiny_dense()
    key = r.collectives[("all_reduce", "tp")]
    r10 = replace(r, collectives={**r.collectives,
                                  ("all_reduce", "tp"): dataclasses.replace(key, floor_ns=key.floor_ns * 10)})
    b = decode(4, 101)
    d = totals(r10, b).nvlink_s - totals(r, b).nvlink_s
    assert d == pytest.approx(4 * 9 * 10e-6, rel=1e-12)


def test_unpriced_collective_is_infinite() -> None:
    r = tiny_dense()
    r2 = replace(r, collectives={})
    est = price(r2, decode(4, 101))
    assert est.per_resource is not None
    assert est.per_resource[Resource.NVLINK] == MAX_DURATION_NS
    assert est.no_overlap == MAX_DURATION_NS
    assert est.bottleneck is Resource.NVLINK


def test_finish_bottleneck_ties_go_to_the_earlier_resource() -> None:
    t = step.StepTotals(1e-3, 1e-3, 0.0, 0.0, 5e-4, 500_000, 1e-3, False)
    est = step.finish(t, {})
    assert est.bottleneck is Resource.SM
    assert est.no_overlap == 2_500_000
    assert est.overlap == 1_500_000
    t = step.StepTotals(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, False)
    assert step.finish(t, {}).bottleneck is Resource.SM


def test_finish_overlap_clamped_to_no_overlap() -> None:
    t = step.StepTotals(1e-3, 0.0, 0.0, 0.0, 1e-6, 1_000, 5e-3, False)
    est = step.finish(t, None)
    assert est.overlap == est.no_overlap == 1_001_000


def test_host_duration_round_trip_goes_through_seconds() -> None:
    """per[host] = toDuration(host.Seconds()) (model.md §0.1), which may differ from host by 1
    ns."""
    t = step.StepTotals(1e-3, 0.0, 0.0, 0.0, laws.duration_seconds(123_456_789), 123_456_789,
                        1e-3, False)
    est = step.finish(t, {})
    assert est.per_resource is not None
    assert est.per_resource[Resource.HOST] == laws.to_duration_ns(
        laws.duration_seconds(123_456_789))


def test_degenerate_ramp_gives_go_nan_not_exceptions() -> None:
    """eps_max 0: Go divides by a zero ramp — dense SM +Inf, routed SM 0/0 = NaN, so the SM
    total is NaN and summarize converts it to 0 ns (NaN <= 0 is false, so it is listed)."""
    r = replace_coeffs(tiny_dense(), eps_max=0.0)
    assert math.isnan(totals(r, decode(4, 101)).sm_s)
    est = price(r, decode(4, 101))
    assert est.per_resource is not None
    assert est.per_resource[Resource.SM] == 0


# --- the CLI's batch spec ------------------------------------------------------------------


def test_batch_spec_groups_and_file(tmp_path) -> None:  # noqa: ANN001
    import json

    from kernel.cli.price_one import parse_batch_spec

    reqs = parse_batch_spec("32x1@4095, 1x512@0,7@3")
    assert len(reqs) == 34
    assert (reqs[0].scheduled, reqs[0].computed) == (1, 4095)
    assert (reqs[32].scheduled, reqs[32].computed) == (512, 0)
    assert (reqs[33].scheduled, reqs[33].computed) == (7, 3)
    f = tmp_path / "b.json"
    f.write_text(json.dumps([{"scheduled": 5, "computed": 9, "prompt_len": 14}]))
    (q,) = parse_batch_spec(str(f))
    assert (q.scheduled, q.computed, q.prompt_len) == (5, 9, 14)
    import click

    with pytest.raises(click.BadParameter):
        parse_batch_spec("32y1@4")


def test_shape_aware_gemms_match_shape_efficiency_law() -> None:
    """gemm_n_half/gemm_k_half present: per planned GEMM, n = N/tp if ShardN else k = K/tp,
    denseShaped += T·f/tp / (peak·ShapeEfficiency(T, n, k, …)) (model.md §2.3). No embedded scenario
    is shape-aware, so the fixture is the only check of step.py's prepared n/k factors."""
    r = tiny_dense(layout_kw=dict(tp=2),
                   coeff_kw=dict(shape_aware=True, n_half=3072.0, k_half=2048.0))
    flat = tiny_dense(layout_kw=dict(tp=2))
    for n_req in (1, 7, 300):
        b = decode(n_req, 100)
        T = float(n_req)
        shaped = 0.0
        for g in r.plan.layers[0].dense_gemms:
            n, k = float(g.n), float(g.k)
            if g.shard_n:
                n /= 2.0
            else:
                k /= 2.0
            eff = laws.shape_efficiency(T, n, k, 0.8, 100.0, 3072.0, 2048.0)
            shaped = shaped + T * g.flops_per_token / 2.0 / (1e15 * eff)
        ramp = 0.8 * T / (T + 100.0)
        flat_flops = T * r.plan.layers[0].dense_flops_per_token / 2.0 / (1e15 * ramp)
        d = totals(r, b).sm_s - totals(flat, b).sm_s
        assert d == pytest.approx(4 * (shaped - flat_flops), rel=1e-9)
        trace: list[dict[str, float]] = []
        step._compose(step.prepared(r), step.summarise(r, b), trace)
        assert trace[0]["dense_sm"] == shaped + 0.0  # bit-exact: same factors, same order
