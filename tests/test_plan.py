"""The plan views (model.md §9.4; golden cases 39–44, §14.2).

Small graphs are built in the test and planned through the SQL views (``plan_layers``,
``plan_gemms``, ``plan_attentions``, ``plan_collectives``, ``plan_totals``).
"""

from __future__ import annotations

from dataclasses import replace

from pipeline.documents import GlobalShape, Graph, LayerKind, Node, Stack
from tests.resolution_support import (
    DS3,
    NEMOTRON,
    batch,
    first_refusals,
    inputs,
    query,
    variant,
)

HIDDEN = 7168


def graph(name: str, kinds: dict[str, list[Node]], pattern: list[str], repeat: int = 1,
          weight_dtype: str = "fp8", head: tuple[Node, ...] = ()) -> Graph:
    return Graph(kind="ModelGraph", name=name,
                 global_=GlobalShape(hidden_size=HIDDEN, vocab_size=1000, weight_dtype=weight_dtype),
                 layer_kinds=tuple(LayerKind(id=k, nodes=tuple(v)) for k, v in kinds.items()),
                 stack=Stack(pattern=tuple(pattern), repeat=repeat), head=head)


def planned(model: Graph, tp: int = 8, quantization: str = "fp8", key: str = "g", **parallel):
    inp = variant(replace(inputs(DS3), model=model), parallel={"tp": tp, **parallel},
                  engine={"quantization": quantization},
                  scenario={"model": model.name})
    return batch({key: inp})


def layer(con, kind: str) -> dict:
    (row,) = query(con, "SELECT * FROM plan_layers WHERE layer_kind = ?", kind)
    return row


def gemm(role: str, n: int, k: int, **kw) -> Node:
    return Node(op="GEMM", role=role, n=n, k=k, **kw)


def test_hybrid_counts():  # case 39
    con = batch({"nemo": inputs(NEMOTRON)})
    (tot,) = query(con, "SELECT total_layers, hybrid FROM plan_totals")
    assert tot == {"total_layers": 108, "hybrid": True}
    rows = query(con, "SELECT layer_kind, count FROM plan_layers WHERE NOT is_head "
                 "ORDER BY position")
    assert len(rows) == 3 and sum(r["count"] for r in rows) == 108
    assert [r["layer_kind"] for r in rows] == ["mamba", "moe", "attention"]


def test_expert_weight_bytes_bf16():  # case 40
    moe = [Node(op="GroupedGEMM", role="experts", n=5120, k=8192, experts=64, top_k=4)]
    con = planned(graph("t40", {"moe": moe}, ["moe"], weight_dtype="bf16"), quantization="")
    row = layer(con, "moe")
    assert row["expert_weight_bytes_per_expert"] == 3 * 5120 * 8192 * 2 == 251_658_240
    assert row["expert_flops_per_token_per_expert"] == 6 * 5120 * 8192
    assert row["top_k"] == 4 and row["kernels"] == 4


def test_mixed_precision_dense_and_expert_override():  # cases 41, 42
    def kinds(expert_dtype: str):
        return {"moe": [gemm("qkv", 66560, 7168),
                        Node(op="GroupedGEMM", role="experts", n=3072, k=7168, experts=64,
                             top_k=8, weight_dtype=expert_dtype)]}
    plain = layer(planned(graph("t41a", kinds(""), ["moe"], weight_dtype="fp8"),
                          quantization=""), "moe")
    mixed = layer(planned(graph("t41b", kinds("nvfp4"), ["moe"], weight_dtype="fp8"),
                          quantization=""), "moe")
    assert plain["dense_weight_bytes"] == mixed["dense_weight_bytes"] == 66560 * 7168
    assert plain["expert_weight_bytes_per_expert"] == 3 * 3072 * 7168 * 1
    assert mixed["expert_weight_bytes_per_expert"] == 3 * 3072 * 7168 * 0.5
    assert mixed["expert_flops_per_token_per_expert"] == plain["expert_flops_per_token_per_expert"]


def test_emit_none_layout_and_errors():  # case 43
    nodes = [gemm("qkv", 9216, HIDDEN), Node(op="AllReduce", role="o", emit="tensor_parallel"),
             Node(op="All2All", role="moe", emit="expert_parallel")]
    at1 = planned(graph("t43", {"a": nodes}, ["a"]), tp=1)
    at8 = planned(graph("t43", {"a": nodes}, ["a"]), tp=8)
    assert query(at1, "SELECT * FROM plan_collectives") == []
    ops = [(r["op"], r["group"]) for r in query(at8, "SELECT * FROM plan_collectives")]
    assert ops == [("all_reduce", "tp")]
    assert layer(at1, "a")["dense_flops_per_token"] == layer(at8, "a")["dense_flops_per_token"]
    assert layer(at1, "a")["kernels"] == 1 and layer(at8, "a")["kernels"] == 2

    bad_emit = graph("t43b", {"a": [*nodes, Node(op="AllReduce", role="x", emit="sometimes")]},
                     ["a"])
    undeclared = graph("t43c", {"a": nodes}, ["a", "missing"])
    base = inputs(DS3)
    rows = first_refusals({
        "emit": variant(replace(base, model=bad_emit), scenario={"model": "t43b"}),
        "stack": variant(replace(base, model=undeclared), scenario={"model": "t43c"}),
    })
    assert rows["emit"]["setting"] == "emit" and "'sometimes'" in rows["emit"]["reason"]
    assert "cannot evaluate" in rows["emit"]["reason"]
    assert rows["stack"]["setting"] == "stack" and rows["stack"]["value"] == "missing"
    assert "does not declare" in rows["stack"]["reason"]


def test_block_sparse_attention_either_order():  # case 44
    indexer = Node(op="Attention", role="block_index_scores", kind="sparse_mla", n_q=4, n_kv=1,
                   d_h=128)
    swa = Node(op="Attention", kind="swa", n_q=64, n_kv=4, d_h=128, window=2176)
    for i, order in enumerate(([indexer, swa], [swa, indexer])):
        con = planned(graph(f"t44{i}", {"bs": order}, ["bs"]))
        row = layer(con, "bs")
        assert (row["attn_q_heads"], row["attn_kv_heads"], row["attn_kind"],
                row["attn_window"]) == (64, 4, "swa", 2176)
        atts = query(con, "SELECT * FROM plan_attentions ORDER BY attention_index")
        assert len(atts) == 2 and sum(a["holds_kv"] for a in atts) == 1
        assert row["non_kv_attentions"] == 1


def test_gemm_fusion_rule():  # model.md §9.4 fusion chain
    nodes = [
        Node(op="Elementwise", role="norm"),
        gemm("q", 4096, HIDDEN), gemm("k", 1024, HIDDEN),          # fuse (ShardN, same K)
        Node(op="AllReduce", role="x", emit="expert_parallel"),     # dropped: chain survives
        gemm("v", 1024, HIDDEN),                                     # fuses into q+k
        Node(op="Elementwise", role="act"),                          # ends the chain
        gemm("up", 2048, HIDDEN),                                    # new entry
        gemm("down", HIDDEN, 2048),                                  # row-parallel: new entry
        gemm("o", HIDDEN, 4096),                                     # not ShardN: new entry
    ]
    con = planned(graph("tfuse", {"f": nodes}, ["f"], head=(gemm("lm_head", 1000, HIDDEN),)))
    rows = query(con, "SELECT n, k, flops_per_token, shard_n, fused_nodes FROM plan_gemms "
                 "WHERE layer_kind = 'f' ORDER BY gemm_index")
    assert [(r["n"], r["k"], r["shard_n"], r["fused_nodes"]) for r in rows] == [
        (6144, HIDDEN, True, 3), (2048, HIDDEN, True, 1), (HIDDEN, 2048, False, 1),
        (HIDDEN, 4096, False, 1)]
    assert rows[0]["flops_per_token"] == 2 * 6144 * HIDDEN
    f = layer(con, "f")
    assert f["dense_flops_per_token"] == sum(r["flops_per_token"] for r in rows)
    assert f["elementwise_bytes_per_token"] == 2 * (2 * HIDDEN * 2)
    assert f["kernels"] == 2 + 6  # two elementwise, six GEMMs; the dropped node costs none
    (tot,) = query(con, "SELECT total_layers, total_kernels, piecewise_segments FROM plan_totals")
    assert tot == {"total_layers": 1, "total_kernels": 8 + 1, "piecewise_segments": 2}


def test_recurrent_state_bytes():  # model.md §9.4 recurrentBytes
    mamba = Node(op="RecurrentUpdate", recurrent_kind="mamba2", n_heads=256, state_size=128,
                 n_groups=8, conv_kernel=4, intermediate_size=16384)
    kda = Node(op="RecurrentUpdate", recurrent_kind="kda", n_heads=96, state_size=128)
    con = planned(graph("trec", {"m": [mamba], "k": [kda]}, ["m", "k"]))
    conv = (16384 + 2 * 8 * 128) * 3
    assert layer(con, "m")["recurrent_state_bytes"] == (conv + 256 * 128 * 128) * 4
    assert layer(con, "k")["recurrent_state_bytes"] == 96 * 128 * 128 * 4
    assert layer(con, "m")["kernels"] == 2


def test_shared_experts_and_piecewise_segments_on_embedded_graphs():
    con = batch({"ds3": inputs(DS3), "glm5": inputs("glm5-h200-tp8")})
    moe = query(con, "SELECT * FROM plan_layers WHERE scenario = 'ds3' AND layer_kind = "
                "'attn_moe'")[0]
    assert moe["shared_expert_flops_per_token"] == 2 * 3 * 2048 * HIDDEN
    assert moe["experts"] == 256 and moe["top_k"] == 8
    segs = {r["scenario"]: r["piecewise_segments"] for r in query(
        con, "SELECT scenario, piecewise_segments FROM plan_totals")}
    assert segs["ds3"] == 61 + 1
    n_sparse = query(con, "SELECT sum(count) AS n FROM plan_layers WHERE scenario = 'glm5' "
                     "AND attn_kind = 'sparse_mla' AND non_kv_attentions > 0")[0]["n"]
    assert segs["glm5"] == 78 + n_sparse + 1


def test_activation_width_and_kv_bytes():  # cases 35, 37, 105, 111, 112
    from pipeline.documents import Graph as _Graph
    from pipeline.load import load_document
    from pipeline.resources import data_dir

    qwen, _ = load_document(_Graph, data_dir() / "catalog" / "models" / "qwen3-30b-a3b" /
                            "graph.yaml")
    mm = inputs("minimax-m25-h200-tp8")
    con = batch({
        "ds3-tp8": inputs(DS3),
        "ds3-tp1": variant(inputs(DS3), parallel={"tp": 1}),
        "qwen-on-mm25": variant(replace(mm, model=qwen), scenario={"model": qwen.name}),
    })
    rows = {r["scenario"]: r for r in query(
        con, "SELECT scenario, activation_width, kv_bytes_per_token FROM resolved_pools")}
    assert rows["ds3-tp8"]["activation_width"] == 7168
    assert rows["qwen-on-mm25"]["activation_width"] == 4096
    assert rows["ds3-tp8"]["kv_bytes_per_token"] == rows["ds3-tp1"]["kv_bytes_per_token"] \
        == 61 * 576 * 1 == 35136
