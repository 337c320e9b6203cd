-- Collective keys, group geometry and width snapping (kernel-algorithm.md §1.10, §2.7).

-- The (op, group) keys lifted for each pool.
CREATE OR REPLACE VIEW pool_collective_keys AS
WITH l AS (
    SELECT l.*, d.comm_backend FROM pool_layout l JOIN pool_dcp d USING (scenario, pool)
), keys AS (
    SELECT scenario, pool, 1 AS key_order, 'all_reduce' AS op, 'tp' AS "group" FROM l
    UNION ALL SELECT scenario, pool, 2, 'all_gather', 'tp' FROM l
    UNION ALL SELECT scenario, pool, 3, 'reduce_scatter', 'tp' FROM l
    UNION ALL SELECT scenario, pool, 4, 'all2all', 'expert' FROM l
    UNION ALL SELECT scenario, pool, 5, 'all_gather', 'dcp' FROM l WHERE dcp > 1
    UNION ALL
    SELECT scenario, pool, 6,
           CASE WHEN comm_backend = 'a2a' THEN 'all2all' WHEN pcp > 1 THEN 'all_reduce'
                ELSE 'reduce_scatter' END, 'dcp' FROM l WHERE dcp > 1
    UNION ALL SELECT scenario, pool, 7, 'all_gather', 'pcp' FROM l WHERE pcp > 1
)
SELECT k.scenario, k.pool, k.key_order, k.op, k."group",
       CASE k.op WHEN 'all2all' THEN 'alltoall' ELSE k.op END AS coefficient_op,
       replace(l.chip, '-', '_') AS chip_key, l.chip,
       CASE k."group" WHEN 'tp' THEN greatest(l.tp, 1) WHEN 'expert' THEN greatest(l.moe_group, 1)
                      WHEN 'dcp' THEN greatest(l.dcp, 1) ELSE greatest(l.pcp, 1) END AS width,
       CASE WHEN k."group" = 'pcp' THEN greatest(l.tp, 1)
            WHEN k."group" = 'dcp' AND l.pcp > 1 AND l.dcp <= l.pcp THEN greatest(l.tp, 1)
            ELSE 1 END AS stride,
       l.gpus_per_node, l.rack_is_one_domain, l.rack_width, l.fabric_ratio, l.routed_all2all
FROM keys k JOIN l USING (scenario, pool);

-- Widths with a complete floor/peak/transition triple in scope, per pool, op and chip key.
CREATE OR REPLACE VIEW pool_measured_widths AS
WITH parsed AS (
    SELECT scenario, pool, name,
           regexp_extract(name, '^collective_(floor|peak_rate|transition_rate)_'
                                || '(all_reduce|all_gather|reduce_scatter|alltoall)_fp16_'
                                || '([0-9]+)rank_(.+)$', ['part', 'op', 'w', 'chip']) AS m
    FROM coefficients_in_scope WHERE name LIKE 'collective_%'
)
SELECT scenario, pool, m.op AS coefficient_op, m.chip AS chip_key, CAST(m.w AS BIGINT) AS width
FROM parsed
WHERE m.part <> '' AND CAST(m.w AS BIGINT) >= 1
GROUP BY scenario, pool, m.op, m.chip, m.w
HAVING count(DISTINCT m.part) = 3;

CREATE OR REPLACE VIEW collective_keys AS
WITH g AS (
    SELECT k.*,
           CASE WHEN k.gpus_per_node <= 0 THEN 4611686018427387904
                ELSE greatest(k.gpus_per_node // k.stride, 1) END AS per_node
    FROM pool_collective_keys k
), x AS (
    SELECT g.*,
           CASE WHEN g.gpus_per_node <= 0 THEN false
                WHEN g.width <= g.per_node THEN false
                WHEN g.rack_is_one_domain AND g.rack_width > 0
                     AND g.width * g.stride <= g.rack_width THEN false
                ELSE true END AS crosses_nodes,
           (SELECT list(w.width ORDER BY w.width) FROM pool_measured_widths w
            WHERE w.scenario = g.scenario AND w.pool = g.pool
              AND w.coefficient_op = g.coefficient_op AND w.chip_key = g.chip_key) AS measured
    FROM g
), s AS (
    SELECT x.*,
           CASE WHEN coalesce(len(measured), 0) = 0 THEN NULL
                WHEN width <= measured[1] THEN measured[1]
                WHEN list_contains(measured, width) THEN width
                WHEN width > 16 THEN measured[-1]
                ELSE NULL END AS ranks,
           CASE WHEN NOT crosses_nodes THEN CAST(1 AS DOUBLE)
                WHEN op = 'all2all' AND ("group" <> 'expert' OR routed_all2all)
                    THEN all2all_span(width, per_node, fabric_ratio)
                ELSE ring_span(width, per_node, fabric_ratio) END AS span
    FROM x
), stem AS (
    SELECT s.*, coefficient_op || '_fp16_' || ranks || 'rank_' || chip_key AS stem FROM s
)
SELECT t.scenario, t.pool, t.key_order, t.op, t."group", t.coefficient_op, t.chip, t.width,
       t.stride, least(t.per_node, t.width) AS ranks_per_node, t.per_node, t.crosses_nodes,
       t.span, t.measured, t.ranks, t.stem,
       f.ns_value AS floor_ns, pk.si_value AS peak_bps, tr.si_value AS transition_bps,
       CASE WHEN coalesce(len(t.measured), 0) = 0 THEN
                'no measured ' || t.coefficient_op || ' widths at all for the ' || t."group"
                || ' group on ' || t.chip || ': the scenario''s coefficient sets carry no complete '
                || 'collective_{floor,peak_rate,transition_rate}_' || t.coefficient_op
                || '_fp16_<N>rank_' || t.chip_key || ' triple'
            WHEN t.ranks IS NULL THEN
                'no ' || t.width || '-rank ' || t.coefficient_op || ' measurement for ' || t.chip
                || ': the registry carries ' || go_int_list(t.measured)
                || '-rank figures, and a width is never borrowed from a narrower measurement'
            WHEN f.ns_value IS NULL THEN 'no measured floor for a ' || t.ranks || '-rank '
                || t.coefficient_op || ' on ' || t.chip || ' (collective_floor_' || t.stem || ')'
            WHEN pk.si_value IS NULL THEN 'no measured rate for a ' || t.ranks || '-rank '
                || t.coefficient_op || ' on ' || t.chip || ' (collective_peak_rate_' || t.stem || ')'
            WHEN tr.si_value IS NULL THEN 'no measured transition rate for a ' || t.ranks
                || '-rank ' || t.coefficient_op || ' on ' || t.chip
                || ' (collective_transition_rate_' || t.stem || ')'
            ELSE NULL END AS refusal
FROM stem t
LEFT JOIN coefficients_lifted f
    ON f.scenario = t.scenario AND f.pool = t.pool AND f.name = 'collective_floor_' || t.stem
LEFT JOIN coefficients_lifted pk
    ON pk.scenario = t.scenario AND pk.pool = t.pool AND pk.name = 'collective_peak_rate_' || t.stem
LEFT JOIN coefficients_lifted tr
    ON tr.scenario = t.scenario AND tr.pool = t.pool
   AND tr.name = 'collective_transition_rate_' || t.stem;
