-- materialize: true
-- Expert geometry (model.md §4.1): physical experts with the redundant ones, and
-- how many land on each rank.

CREATE OR REPLACE VIEW pool_experts AS
WITH x AS (
    SELECT l.scenario, l.pool, t.experts, l.expert_width, l.tp, l.dp,
           CASE WHEN p.eplb_enable THEN p.eplb_num_redundant_experts ELSE 0 END AS redundant
    FROM pool_layout l JOIN plan_totals t USING (scenario, pool) JOIN pools p USING (scenario, pool)
), r AS (
    -- kernel.model.laws.experts_per_rank: (base, heaviest) experts per rank
    SELECT *, experts_per_rank(experts + redundant, greatest(expert_width, 1)) AS per_rank
    FROM x
)
SELECT scenario, pool, experts, redundant, expert_width,
       CASE WHEN expert_width <= 1 THEN tp * greatest(dp, 1) ELSE 1 END AS expert_tensor_shards,
       CASE WHEN experts > 0 THEN experts + redundant ELSE 0 END AS total_experts,
       CASE WHEN experts > 0 THEN per_rank.base ELSE 0 END AS experts_base,
       CASE WHEN experts > 0 THEN per_rank.heaviest ELSE 0 END AS experts_per_rank
FROM r;
