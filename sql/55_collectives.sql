-- materialize: true
-- Collective keys, group geometry and width snapping (model.md §5.3, §5.4).

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

-- Widths with a complete floor/peak/transition triple in scope, per pool and lifted (op, chip
-- key): kernel.model.laws.measured_collective_widths over the pool's collective names.
CREATE OR REPLACE VIEW pool_measured_widths AS
WITH names AS (
    SELECT scenario, pool, list(name ORDER BY name) AS names
    FROM coefficients_in_scope WHERE name LIKE 'collective_%'
    GROUP BY scenario, pool
), keys AS (
    SELECT DISTINCT scenario, pool, coefficient_op, chip_key, chip FROM pool_collective_keys
)
SELECT k.scenario, k.pool, k.coefficient_op, k.chip_key,
       unnest(measured_collective_widths(n.names, k.coefficient_op, k.chip)) AS width
FROM keys k JOIN names n USING (scenario, pool);

-- The assumed extension for unmeasured widths (docs/decisions.md, issue 18). Where a key's
-- group is 16 ranks or wider and the width rule below would refuse it (no measurement at that
-- width, none wider, and not past the clamp), and the scenario was opened with the extension
-- on, its floor/peak/transition triple is derived from the two widest measured widths of the
-- same op and chip by kernel.model.laws.assumed_collective_figure:
--   floor(w) = f1 + max(0, (f1 - f0) / (w1 - w0)) * (w - w1)   (ring: a step per rank)
--   rate(w) = rate(w1) * ((w1 - 1) / w1) / ((w - 1) / w)      (ring bus-bandwidth factor)
-- The figures describe the group on one NVLink domain; where it spans nodes the kernel's
-- span (model.md §5.4) prices the inter-node fabric on top, as it does for every crossing group.
CREATE OR REPLACE VIEW collective_width_extension AS
WITH k AS (
    SELECT DISTINCT k.scenario, k.pool, k.coefficient_op, k.chip_key, k.chip, k.width,
           (SELECT list(w.width ORDER BY w.width) FROM pool_measured_widths w
            WHERE w.scenario = k.scenario AND w.pool = k.pool
              AND w.coefficient_op = k.coefficient_op AND w.chip_key = k.chip_key) AS measured
    FROM pool_collective_keys k
    LEFT JOIN scenario_options o USING (scenario)
    WHERE coalesce(o.assumed_collective_widths, true)
), need AS (
    SELECT *, measured[-1] AS w1,
           CASE WHEN len(measured) >= 2 THEN measured[-2] ELSE measured[-1] END AS w0
    FROM k
    WHERE coalesce(len(measured), 0) > 0 AND width >= 16
      AND snap_collective_width(width, measured) IS NULL
), src AS (
    SELECT n.*, part,
           'collective_' || part || '_' || coefficient_op || '_fp16_' || w1 || 'rank_' || chip_key
               AS name1,
           'collective_' || part || '_' || coefficient_op || '_fp16_' || w0 || 'rank_' || chip_key
               AS name0
    FROM need n, (VALUES ('floor'), ('peak_rate'), ('transition_rate')) AS p(part)
), v AS (
    SELECT s.*, c1.value AS v1, c0.value AS v0, c1.units,
           assumed_collective_figure(s.part, s.width, s.w1, c1.value, s.w0, c0.value) AS value
    FROM src s
    JOIN coefficients_in_scope c1
        ON c1.scenario = s.scenario AND c1.pool = s.pool AND c1.name = s.name1
    JOIN coefficients_in_scope c0
        ON c0.scenario = s.scenario AND c0.pool = s.pool AND c0.name = s.name0
)
SELECT scenario, pool, coefficient_op, chip_key, chip, width, part,
       'collective_' || part || '_' || coefficient_op || '_fp16_' || width || 'rank_' || chip_key
           AS name,
       'assumed-collective-widths' AS set, value, units, 'assumed' AS method,
       'hardware: ' || chip AS provenance_scope,
       CASE WHEN part = 'floor' THEN CAST(us_to_ns(value) AS DOUBLE) ELSE value * 1e6 END
           AS si_value,
       CASE WHEN part = 'floor' THEN us_to_ns(value) ELSE NULL END AS ns_value,
       name1 AS derived_from,
       CASE WHEN part = 'floor' THEN
                'no ' || width || '-rank measurement: the ' || w1 || '-rank floor (' || v1
                || ' us) plus the measured per-rank step latency ' || w0 || ' -> ' || w1
                || ' ranks (' || v0 || ' -> ' || v1 || ' us) for each of the ' || (width - w1)
                || ' further ranks, as a ring adds a step per rank (never negative)'
            ELSE 'no ' || width || '-rank measurement: the ' || w1 || '-rank rate (' || v1
                || ' bytes/us) times the ring bus-bandwidth factor ((' || w1 || '-1)/' || w1
                || ') / ((' || width || '-1)/' || width || ')'
            END || '; where the group spans nodes the kernel''s span adds the inter-node fabric'
           AS rationale
FROM v;

-- Every coefficient provenance lists: the registry's in scope, then the assumed extension.
CREATE OR REPLACE VIEW provenance_coefficients AS
-- (`reason` carries the extension's rule, so provenance shows why each figure is what it is.)
SELECT scenario, pool, name, set, method, provenance_scope, provenance_scope_kind,
       provenance_scope_values, value, units, CAST(NULL AS VARCHAR) AS reason
FROM coefficients_in_scope
UNION ALL
SELECT scenario, pool, name, set, method, provenance_scope, 'hardware', [chip], value, units,
       rationale
FROM collective_width_extension;

-- Lifted collective figures: the registry's, then the assumed extension's (disjoint names).
CREATE OR REPLACE VIEW collective_coefficients AS
SELECT scenario, pool, name, si_value, ns_value FROM coefficients_lifted
WHERE name LIKE 'collective_%'
UNION ALL
SELECT scenario, pool, name, si_value, ns_value FROM collective_width_extension;

-- vLLM's tensor-parallel all-reduce as the engine runs it (docs/decisions.md AC1, AC2): where
-- the custom all-reduce is resolved on (pool_allreduce) and the coefficient sets in scope carry
-- measured knots for the pool's tp width and chip (the measured layer, Repos(pricing=...)),
-- the (all_reduce, tp) key is priced from them: message bytes ascending, latency in ns.
CREATE OR REPLACE VIEW pool_allreduce_knots AS
WITH k AS (
    SELECT c.scenario, c.pool, c.ns_value,
           CAST(regexp_extract(c.name, '_([0-9]+)B$', 1) AS DOUBLE) AS nbytes
    FROM coefficients_lifted c
    JOIN pool_layout l USING (scenario, pool)
    JOIN pool_allreduce a USING (scenario, pool)
    WHERE a.custom_all_reduce AND c.ns_value IS NOT NULL
      AND regexp_full_match(c.name, 'collective_knot_all_reduce_' || l.tp || 'rank_'
                                    || replace(l.chip, '-', '_') || '_[0-9]+B')
)
SELECT scenario, pool, list(nbytes ORDER BY nbytes) AS knot_bytes,
       list(ns_value ORDER BY nbytes) AS knot_ns
FROM k GROUP BY scenario, pool HAVING count(*) >= 2;

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
              AND w.coefficient_op = g.coefficient_op AND w.chip_key = g.chip_key) AS measured,
           EXISTS (SELECT 1 FROM collective_width_extension a
                   WHERE a.scenario = g.scenario AND a.pool = g.pool
                     AND a.coefficient_op = g.coefficient_op AND a.chip_key = g.chip_key
                     AND a.width = g.width) AS assumed,
           coalesce((SELECT o.assumed_collective_widths FROM scenario_options o
                     WHERE o.scenario = g.scenario), true) AS extension_on
    FROM g
), s AS (
    SELECT x.*,
           -- kernel.model.laws.snap_collective_width, else the assumed extension's own width
           CASE WHEN assumed THEN width ELSE snap_collective_width(width, measured) END
               AS ranks,
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
       t.span, t.measured, t.ranks, t.assumed, t.stem,
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
                || CASE WHEN t.width >= 16 AND NOT t.extension_on
                        THEN ' (the assumed extension for unmeasured widths is turned off)'
                        ELSE '' END
            WHEN f.ns_value IS NULL THEN 'no measured floor for a ' || t.ranks || '-rank '
                || t.coefficient_op || ' on ' || t.chip || ' (collective_floor_' || t.stem || ')'
            WHEN pk.si_value IS NULL THEN 'no measured rate for a ' || t.ranks || '-rank '
                || t.coefficient_op || ' on ' || t.chip || ' (collective_peak_rate_' || t.stem || ')'
            WHEN tr.si_value IS NULL THEN 'no measured transition rate for a ' || t.ranks
                || '-rank ' || t.coefficient_op || ' on ' || t.chip
                || ' (collective_transition_rate_' || t.stem || ')'
            ELSE NULL END AS refusal,
       CASE WHEN t.op = 'all_reduce' AND t."group" = 'tp' AND NOT t.crosses_nodes
            THEN kn.knot_bytes END AS knot_bytes,
       CASE WHEN t.op = 'all_reduce' AND t."group" = 'tp' AND NOT t.crosses_nodes
            THEN kn.knot_ns END AS knot_ns
FROM stem t
LEFT JOIN pool_allreduce_knots kn ON kn.scenario = t.scenario AND kn.pool = t.pool
LEFT JOIN collective_coefficients f
    ON f.scenario = t.scenario AND f.pool = t.pool AND f.name = 'collective_floor_' || t.stem
LEFT JOIN collective_coefficients pk
    ON pk.scenario = t.scenario AND pk.pool = t.pool AND pk.name = 'collective_peak_rate_' || t.stem
LEFT JOIN collective_coefficients tr
    ON tr.scenario = t.scenario AND tr.pool = t.pool
   AND tr.name = 'collective_transition_rate_' || t.stem;
