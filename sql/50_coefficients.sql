-- materialize: true
-- Coefficient scoping (model.md §9.8) and unit lifting to SI by the declared units
-- (model.md §9.9).
--
-- Sets apply in the scenario's order; within the scenario's sets the last entry whose scope
-- admits the pool wins for each name. Scope: every stated dimension must contain the pool's
-- value (hardware and model compared case-insensitively); unstated dimensions admit anything.

CREATE OR REPLACE VIEW coefficients_in_scope AS
WITH cand AS (
    SELECT l.scenario, l.pool, sc.position AS set_position, c.*,
           CASE WHEN len(c.scope_hardware) > 0 THEN 'hardware: ' || c.scope_hardware[1]
                WHEN len(c.scope_model) > 0 THEN 'model: ' || c.scope_model[1]
                ELSE 'unscoped' END AS provenance_scope,
           -- the same axis, typed, with every value (not only the first)
           CASE WHEN len(c.scope_hardware) > 0 THEN 'hardware'
                WHEN len(c.scope_model) > 0 THEN 'model'
                ELSE 'unscoped' END AS provenance_scope_kind,
           CASE WHEN len(c.scope_hardware) > 0 THEN c.scope_hardware
                WHEN len(c.scope_model) > 0 THEN c.scope_model
                ELSE []::VARCHAR[] END AS provenance_scope_values
    FROM pool_layout l
    JOIN scenario_coefficient_sets sc ON sc.scenario = l.scenario
    JOIN coefficients c ON c.set = sc.set
    WHERE (len(c.scope_hardware) = 0
           OR list_contains(list_transform(c.scope_hardware, lambda h: lower(h)), lower(l.chip)))
      AND (len(c.scope_model) = 0
           OR list_contains(list_transform(c.scope_model, lambda m: lower(m)), lower(l.model)))
      AND (len(c.scope_tp) = 0 OR list_contains(c.scope_tp, l.tp))
      AND (len(c.scope_ep) = 0 OR list_contains(c.scope_ep, l.expert_width))
      AND (len(c.scope_nodes_spanned) = 0 OR list_contains(c.scope_nodes_spanned, l.nodes_spanned))
)
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY scenario, pool, name
                                 ORDER BY set_position DESC, entry_index DESC) AS rn
    FROM cand
) WHERE rn = 1;

-- Each in-scope coefficient lifted to SI by its declared units (the tables come from
-- pipeline/units.py): µs → integer ns (truncated, us_to_ns), bytes/µs → bytes/s, tokens/µs →
-- tokens/s, everything else as stated. `quantity` is what the name measures (first matching
-- pattern; for a name the kernel does not read, what its units measure); `units_fit` is false
-- when the declared units do not measure it, and 90_refusals.sql refuses the pool.
CREATE OR REPLACE VIEW coefficients_lifted AS
WITH named AS (
    SELECT c.scenario, c.pool, c.name, arg_min(q.quantity, q.position) AS quantity
    FROM coefficients_in_scope c JOIN coefficient_quantities q ON c.name GLOB q.pattern
    GROUP BY c.scenario, c.pool, c.name
), typed AS (
    SELECT c.scenario, c.pool, c.name, c.set, c.entry_index, c.value, c.units, c.method,
           n.quantity
    FROM coefficients_in_scope c LEFT JOIN named n USING (scenario, pool, name)
), unit AS (
    SELECT t.scenario, t.pool, t.name, arg_min(u.quantity, u.position) AS quantity,
           arg_min(u.si_unit, u.position) AS si_unit, arg_min(u.factor, u.position) AS factor
    FROM typed t JOIN coefficient_units u
      ON u.unit = t.units AND (t.quantity IS NULL OR u.quantity = t.quantity)
    GROUP BY t.scenario, t.pool, t.name
)
SELECT t.scenario, t.pool, t.name, t.set, t.entry_index, t.value, t.units, t.method,
       coalesce(t.quantity, u.quantity) AS quantity, u.si_unit IS NOT NULL AS units_fit,
       u.si_unit,
       CASE WHEN u.si_unit = 'ns' THEN CAST(us_to_ns(t.value) AS DOUBLE)
            WHEN u.factor = 1 THEN t.value
            ELSE t.value * u.factor END AS si_value,
       CASE WHEN u.si_unit = 'ns' THEN us_to_ns(t.value) END AS ns_value
FROM typed t LEFT JOIN unit u USING (scenario, pool, name);

-- The names lift() reads for each pool, with whether each is required and needed (model.md §9.9),
-- in lift order (`lift_order`), the value when present, and for an optional name how it is
-- priced without (`reason`; NULL for a required name).
CREATE OR REPLACE VIEW pool_coefficient_needs AS
WITH p AS (
    SELECT l.scenario, l.pool, d.gemm_suffix, t.has_attention, t.experts, t.recurrent_kinds,
           t.attention_kinds, e.graph_mode_name, l.tp, l.moe_group, l.pcp, l.dcp
    FROM pool_layout l JOIN pool_dtypes d USING (scenario, pool)
    JOIN plan_totals t USING (scenario, pool) JOIN pool_engine e USING (scenario, pool)
), names AS (
    SELECT scenario, pool, 1 AS lift_order, 'hbm_derate' AS name, true AS required,
           true AS needed, CAST(NULL AS VARCHAR) AS reason FROM p
    UNION ALL SELECT scenario, pool, 3, 'gemm_eps_max_' || gemm_suffix, true, true, NULL FROM p
    UNION ALL SELECT scenario, pool, 4, 'gemm_m_half_' || gemm_suffix, true, true, NULL FROM p
    UNION ALL SELECT scenario, pool, 5, 'gemm_n_half_' || gemm_suffix, false, false, NULL FROM p
    UNION ALL SELECT scenario, pool, 6, 'gemm_k_half_' || gemm_suffix, false, false, NULL FROM p
    UNION ALL
    SELECT scenario, pool, 80 + i * 2 + j, 'recurrent_decode_' || f || '_' || k, false,
           list_contains(coalesce(recurrent_kinds, []), k), 'no recurrent term'
    FROM p, (VALUES (0, 'mamba2'), (1, 'kda'), (2, 'gdn')) AS rk(i, k),
         (VALUES (0, 'floor'), (1, 'rate')) AS rf(j, f)
    UNION ALL SELECT scenario, pool, 90, 'attention_decode_floor', false, has_attention,
           'KV read at HBM bandwidth, with no floor' FROM p
    UNION ALL SELECT scenario, pool, 91, 'attention_decode_rate', false, has_attention,
           'KV read at HBM bandwidth, with no floor' FROM p
    UNION ALL
    SELECT scenario, pool, 92 + i, 'attention_decode_rate_' || k, false,
           list_contains(coalesce(attention_kinds, []), k), 'the part-wide pair'
    FROM p, (VALUES (0, 'swa'), (1, 'mla'), (2, 'sparse_mla')) AS ak(i, k)
    UNION ALL SELECT scenario, pool, 100, 'attention_prefill_floor', false, has_attention,
           'the plain ramp, with no floor' FROM p
    UNION ALL SELECT scenario, pool, 101, 'attention_prefill_work_scale', false, has_attention,
           'the plain ramp, with no floor' FROM p
    UNION ALL SELECT scenario, pool, 110, 'host_link_bandwidth', false, true,
           'no cap on tier transfers' FROM p
    UNION ALL SELECT scenario, pool, 120, 'moe_routing_imbalance_median', false, experts > 0,
           'evenly loaded, 1.0' FROM p
    UNION ALL
    SELECT scenario, pool, 130 + i, h, false, true, '0'
    FROM p, (VALUES (0, 'host_admission_per_token'), (1, 'host_admission_per_request'),
                    (2, 'host_output_token'), (3, 'host_completion'),
                    (4, 'host_launch_eager_per_layer'), (5, 'host_launch_per_kernel'),
                    (6, 'host_replay_graph_per_step')) AS hk(i, h)
)
SELECT n.*, c.value, c.si_value, c.ns_value, c.set, c.method, c.name IS NOT NULL AS present
FROM names n
LEFT JOIN coefficients_lifted c USING (scenario, pool, name);

-- Memory magnitudes (model.md §7.1 liftMemory): names after declared-width snapping.
CREATE OR REPLACE VIEW pool_memory_names AS
WITH p AS (
    SELECT l.scenario, l.pool, l.tp, l.moe_group, l.pcp, l.dcp, t.experts, e.graph_mode_name,
           (l.tp > 1 OR l.moe_group > 1 OR l.pcp > 1 OR l.dcp > 1) AS needs_comm,
           CASE WHEN t.experts > 0 THEN 'moe' ELSE 'dense' END AS act_kind
    FROM pool_layout l JOIN plan_totals t USING (scenario, pool)
    JOIN pool_engine e USING (scenario, pool)
), declared AS (
    SELECT p.scenario, p.pool,
           list(w ORDER BY w) FILTER (WHERE EXISTS (
               SELECT 1 FROM coefficients_in_scope c WHERE c.scenario = p.scenario
                 AND c.pool = p.pool AND c.name = 'nccl_communicator_bytes_' || w || 'rank'))
               AS comm_widths,
           list(w ORDER BY w) FILTER (WHERE EXISTS (
               SELECT 1 FROM coefficients_in_scope c WHERE c.scenario = p.scenario
                 AND c.pool = p.pool
                 AND c.name = 'activation_buffer_count_' || p.act_kind || '_' || w || 'rank'))
               AS act_widths
    FROM p, (SELECT unnest(declared_widths()) AS w) AS dw
    GROUP BY p.scenario, p.pool
), snapped AS (
    -- kernel.model.laws.snap_declared: the widest declared width <= the group's, else the narrowest
    SELECT p.*, snap_declared(p.tp, d.comm_widths) AS comm_rank,
           snap_declared(least(p.tp, 8), d.act_widths) AS act_rank
    FROM p JOIN declared d USING (scenario, pool)
), names AS (
    SELECT scenario, pool, 1 AS position, 'comm_bytes' AS magnitude,
           'nccl_communicator_bytes_' || comm_rank || 'rank' AS name, needs_comm AS needed
    FROM snapped
    UNION ALL SELECT scenario, pool, 2, 'workspace_bytes', 'engine_workspace_bytes', true
    FROM snapped
    UNION ALL SELECT scenario, pool, 3, 'capture_bytes',
           'cudagraph_capture_bytes_' || graph_mode_name, true FROM snapped
    UNION ALL SELECT scenario, pool, 4, 'activation_buffers',
           'activation_buffer_count_' || act_kind || '_' || act_rank || 'rank', true FROM snapped
    UNION ALL SELECT scenario, pool, 5, 'activation_floor', 'activation_scratch_floor_bytes', true
    FROM snapped
)
SELECT n.*, c.value, c.name IS NOT NULL AS present
FROM names n LEFT JOIN coefficients_in_scope c USING (scenario, pool, name);
