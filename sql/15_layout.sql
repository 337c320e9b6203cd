-- materialize: true
-- Layout (kernel-algorithm.md §6.1, §2.7): widths, node spanning, SP-MoE, custom all-reduce.

CREATE OR REPLACE VIEW pool_layout AS
WITH base AS (
    SELECT p.scenario, p.pool, p.role, p.tp, p.pp, p.dp, p.pcp, p.dcp,
           p.enable_expert_parallel, p.all2all_backend,
           s.model, s.hardware AS chip, s.fabric, s.rules_version, s.engine_version,
           s.gpus_per_node, s.gpus_per_rack,
           c.gpus_per_rack AS chip_gpus_per_rack,
           c.intra_node_bw_gbps,
           coalesce(f.inter_node_bw_gbps, 0)::DOUBLE AS inter_node_bw_gbps,
           (c.gpus_per_rack > 0 AND c.intra_rack_bw_gbps > 0) AS rack_is_one_domain,
           CASE WHEN p.enable_expert_parallel
                THEN greatest(p.tp, 1) * greatest(p.pcp, 1) * greatest(p.dp, 1) ELSE 1 END
               AS expert_width,
           (NOT coalesce(p.disable_custom_all_reduce, false) AND p.allreduce_backend <> 'nccl')
               AS custom_all_reduce_requested
    FROM pools p
    JOIN scenarios s USING (scenario)
    JOIN chips c ON c.chip = s.hardware
    LEFT JOIN fabrics f ON f.fabric = s.fabric
), widths AS (
    SELECT *,
           CASE WHEN NOT enable_expert_parallel AND dp > 1 THEN tp * greatest(pcp, 1) * dp
                ELSE expert_width END AS moe_group_width
    FROM base
), wide AS (
    SELECT *, greatest(moe_group_width, expert_width) AS moe_group,
           greatest(tp, moe_group_width, tp * greatest(pcp, 1)) AS widest,
           fabric_ratio(intra_node_bw_gbps, inter_node_bw_gbps) AS fabric_ratio,
           CASE WHEN gpus_per_rack > 0 THEN gpus_per_rack ELSE chip_gpus_per_rack END
               AS rack_width
    FROM widths
)
SELECT w.*,
       CASE WHEN w.gpus_per_rack > 0 AND w.widest <= w.gpus_per_rack AND w.rack_is_one_domain
                THEN 1
            WHEN w.gpus_per_node > 0 THEN CAST(ceil(w.widest / w.gpus_per_node) AS BIGINT)
            ELSE 1 END AS nodes_spanned,
       -- the rules pack's two rules (pipeline/rules.py) over its facts in `rules`
       sequence_parallel_moe(w.all2all_backend, w.enable_expert_parallel, w.tp, w.dp,
                             (SELECT list(value) FROM rules r
                              WHERE r.version = w.rules_version
                                AND r.category = 'sp_moe_backends')) AS sequence_parallel_moe,
       custom_allreduce_supports_width(w.tp, (SELECT list(CAST(value AS BIGINT)) FROM rules r
                                               WHERE r.version = w.rules_version
                                                 AND r.category = 'custom_allreduce_world_sizes'))
           AS custom_width_ok,
       (w.enable_expert_parallel
        AND w.all2all_backend NOT IN ('', 'naive', 'allgather_reducescatter'))
           AS routed_all2all
FROM wide w;

-- The all-reduce backend after resolution, and its override reason (§6.1, case 92/144).
CREATE OR REPLACE VIEW pool_allreduce AS
SELECT scenario, pool,
       CASE WHEN NOT custom_all_reduce_requested THEN false
            WHEN NOT custom_width_ok THEN false
            WHEN gpus_per_node > 0 AND tp > gpus_per_node AND NOT rack_is_one_domain THEN false
            ELSE true END AS custom_all_reduce,
       CASE WHEN NOT custom_all_reduce_requested THEN NULL
            WHEN NOT custom_width_ok THEN
                vllm() || ' custom all-reduce supports only the rank counts '
                || (SELECT go_int_list(list(CAST(value AS BIGINT) ORDER BY CAST(value AS BIGINT)))
                    FROM rules r WHERE r.version = l.rules_version
                      AND r.category = 'custom_allreduce_world_sizes')
                || '; tp ' || tp || ' is not one, so the engine falls back to NCCL'
            WHEN gpus_per_node > 0 AND tp > gpus_per_node AND NOT rack_is_one_domain THEN
                'tp ' || tp || ' spans more than one node (' || gpus_per_node
                || ' GPUs per node) and the rack is not one NVLink domain; custom all-reduce'
                || ' needs one NVLink domain, so the engine falls back to NCCL'
            ELSE NULL END AS override_reason
FROM pool_layout l;

-- Emit conditions per pool (§6.1 Emits; schemas.md §4.6). NULL = unrecognised.
CREATE OR REPLACE VIEW pool_nodes AS
SELECT l.scenario, l.pool, n.*,
       CASE n.emit
           WHEN '' THEN true
           WHEN 'always' THEN true
           WHEN 'tensor_parallel' THEN l.tp > 1
           WHEN 'expert_parallel' THEN l.moe_group > 1
           WHEN 'tensor_parallel_unless_sp_moe' THEN l.tp > 1 AND NOT l.sequence_parallel_moe
           ELSE NULL END AS emitted
FROM pool_layout l
JOIN graph_nodes n ON n.model = l.model
WHERE n.layer_kind = '__head__'
   OR n.layer_kind IN (SELECT layer_kind FROM graph_kind_counts c WHERE c.model = l.model);
