-- materialize: true
-- The plan (model.md §9.4): one row per distinct
-- layer kind per pool (plus the head under '__head__'), with FLOPs/bytes per token, the
-- fused dense GEMMs, expert geometry, attention and recurrent fields, kernel launches and
-- the planned collectives. Nodes whose emit condition is false are dropped entirely.

CREATE OR REPLACE VIEW plan_nodes AS
WITH s AS (
    SELECT n.*, d.served_bytes, d.state_bytes, m.hidden_size,
           CASE WHEN n.weight_dtype <> '' AND dtype_bytes(n.weight_dtype) > 0
                THEN dtype_bytes(n.weight_dtype) ELSE d.served_bytes END AS wbytes
    FROM pool_nodes n
    JOIN pool_dtypes d USING (scenario, pool)
    JOIN models m ON m.model = n.model
    WHERE n.emitted
), g AS (
    SELECT *, (op = 'GEMM' AND hidden_size > 0 AND k = hidden_size AND n <> hidden_size)
                  AS shard_n
    FROM s
), f AS (
    SELECT *, lag(op) OVER w AS prev_op, lag(shard_n) OVER w AS prev_shard_n,
           lag(k) OVER w AS prev_k
    FROM g WINDOW w AS (PARTITION BY scenario, pool, layer_kind ORDER BY node_index)
), ff AS (
    SELECT *, coalesce(op = 'GEMM' AND prev_op = 'GEMM' AND prev_shard_n AND shard_n
                       AND prev_k = k, false) AS fuses
    FROM f
)
SELECT *,
       sum(CASE WHEN op = 'GEMM' AND NOT fuses THEN 1 ELSE 0 END) OVER (
           PARTITION BY scenario, pool, layer_kind ORDER BY node_index
           ROWS UNBOUNDED PRECEDING) AS gemm_group,
       CASE op WHEN 'GEMM' THEN 1 WHEN 'GroupedGEMM' THEN 4 WHEN 'Attention' THEN 2
               WHEN 'Elementwise' THEN 1 WHEN 'RecurrentUpdate' THEN 2 WHEN 'AllReduce' THEN 1
               WHEN 'AllGather' THEN 1 WHEN 'ReduceScatter' THEN 1 WHEN 'All2All' THEN 2
               ELSE 1 END AS kernels,
       CASE WHEN op <> 'RecurrentUpdate' THEN 0::DOUBLE
            WHEN recurrent_kind = 'mamba2' THEN
                ((intermediate_size + 2 * n_groups * state_size) * greatest(conv_kernel - 1, 1)
                 + CASE WHEN d_h = 0 THEN n_heads * state_size * state_size
                        ELSE n_heads * d_h * state_size END) * state_bytes
            WHEN recurrent_kind IN ('kda', 'gdn') THEN n_heads * state_size * state_size * state_bytes
            ELSE 0::DOUBLE END AS recurrent_bytes
FROM ff;

-- DenseGEMMs after fusion, in order.
CREATE OR REPLACE VIEW plan_gemms AS
SELECT scenario, pool, layer_kind, gemm_group AS gemm_index,
       sum(n)::BIGINT AS n, min(k)::BIGINT AS k,
       sum(2::DOUBLE * n * k) AS flops_per_token, bool_and(shard_n) AS shard_n,
       count(*) AS fused_nodes
FROM plan_nodes WHERE op = 'GEMM'
GROUP BY scenario, pool, layer_kind, gemm_group;

-- Every attention node (KV holder and secondary scorers), in node order.
CREATE OR REPLACE VIEW plan_attentions AS
SELECT scenario, pool, layer_kind,
       row_number() OVER (PARTITION BY scenario, pool, layer_kind ORDER BY node_index) - 1
           AS attention_index,
       node_index, n_q AS q_heads, n_kv AS kv_heads, d_h AS head_dim, kind, "window", role,
       compress_ratio, role = '' AS holds_kv
FROM plan_nodes WHERE op = 'Attention';

-- Planned collectives (graph nodes), in node order.
CREATE OR REPLACE VIEW plan_collectives AS
SELECT scenario, pool, layer_kind,
       row_number() OVER (PARTITION BY scenario, pool, layer_kind ORDER BY node_index) - 1
           AS collective_index,
       node_index, role,
       CASE op WHEN 'AllReduce' THEN 'all_reduce' WHEN 'AllGather' THEN 'all_gather'
               WHEN 'ReduceScatter' THEN 'reduce_scatter' ELSE 'all2all' END AS op,
       CASE op WHEN 'All2All' THEN 'expert' ELSE 'tp' END AS "group",
       hidden_size * 2::DOUBLE AS bytes_per_token,
       op = 'All2All' AS routed_by_top_k
FROM plan_nodes WHERE op IN ('AllReduce', 'AllGather', 'ReduceScatter', 'All2All');

CREATE OR REPLACE VIEW plan_layers AS
WITH agg AS (
    SELECT scenario, pool, model, layer_kind, any_value(hidden_size) AS hidden_size,
           coalesce(sum(2::DOUBLE * n * k) FILTER (WHERE op = 'GEMM'), 0::DOUBLE) AS dense_flops_per_token,
           coalesce(sum(1::DOUBLE * n * k * wbytes) FILTER (WHERE op = 'GEMM'), 0::DOUBLE)
               AS dense_weight_bytes,
           coalesce(sum(6::DOUBLE * n * k) FILTER (WHERE op = 'GroupedGEMM'), 0::DOUBLE)
               AS expert_flops_per_token_per_expert,
           coalesce(sum(3::DOUBLE * n * k * wbytes) FILTER (WHERE op = 'GroupedGEMM'), 0::DOUBLE)
               AS expert_weight_bytes_per_expert,
           coalesce(arg_max(top_k, node_index) FILTER (WHERE op = 'GroupedGEMM'), 0) AS top_k,
           coalesce(max(experts) FILTER (WHERE op = 'GroupedGEMM'), 0) AS experts,
           coalesce(sum(2::DOUBLE * 3::DOUBLE * (CASE WHEN shared_intermediate_size > 0
                                          THEN shared_intermediate_size ELSE n END)
                        * k * shared_experts)
                    FILTER (WHERE op = 'GroupedGEMM' AND shared_experts > 0), 0::DOUBLE)
               AS shared_expert_flops_per_token,
           coalesce(sum(3::DOUBLE * (CASE WHEN shared_intermediate_size > 0
                                    THEN shared_intermediate_size ELSE n END)
                        * k * shared_experts * wbytes)
                    FILTER (WHERE op = 'GroupedGEMM' AND shared_experts > 0), 0::DOUBLE)
               AS shared_expert_weight_bytes,
           coalesce(arg_min(n_q, node_index) FILTER (WHERE op = 'Attention' AND role = ''), 0)
               AS attn_q_heads,
           coalesce(arg_min(n_kv, node_index) FILTER (WHERE op = 'Attention' AND role = ''), 0)
               AS attn_kv_heads,
           coalesce(arg_min(d_h, node_index) FILTER (WHERE op = 'Attention' AND role = ''), 0)
               AS attn_head_dim,
           coalesce(arg_min(kind, node_index) FILTER (WHERE op = 'Attention' AND role = ''), '')
               AS attn_kind,
           coalesce(arg_min("window", node_index) FILTER (WHERE op = 'Attention' AND role = ''),
                    0) AS attn_window,
           coalesce(arg_min(index_topk, node_index)
                    FILTER (WHERE op = 'Attention' AND role = ''), 0) AS attn_index_top_k,
           coalesce(arg_min(compress_ratio, node_index)
                    FILTER (WHERE op = 'Attention' AND role = ''), 0) AS attn_compress_ratio,
           coalesce(arg_min(kv_lora_rank, node_index)
                    FILTER (WHERE op = 'Attention' AND role = ''), 0) AS attn_kv_lora_rank,
           count(*) FILTER (WHERE op = 'Attention') AS attentions,
           count(*) FILTER (WHERE op = 'Attention' AND role <> '') AS non_kv_attentions,
           coalesce(sum(CASE WHEN bytes_per_token > 0 THEN bytes_per_token
                             ELSE 2::DOUBLE * hidden_size * 2::DOUBLE END)
                    FILTER (WHERE op = 'Elementwise'), 0::DOUBLE) AS elementwise_bytes_per_token,
           coalesce(arg_max(recurrent_kind, node_index) FILTER (WHERE op = 'RecurrentUpdate'),
                    '') AS recurrent_kind,
           coalesce(sum(recurrent_bytes), 0::DOUBLE) AS recurrent_state_bytes,
           sum(kernels)::BIGINT AS kernels
    FROM plan_nodes GROUP BY scenario, pool, model, layer_kind
), kinds AS (
    -- every planned kind appears, even one whose nodes were all dropped
    SELECT l.scenario, l.pool, l.model, c.layer_kind, c.count, c.first_position AS position
    FROM pool_layout l JOIN graph_kind_counts c ON c.model = l.model
    UNION ALL
    SELECT l.scenario, l.pool, l.model, '__head__', 1, 1000000000 FROM pool_layout l
)
SELECT k.scenario, k.pool, k.layer_kind, k.count, k.position,
       k.layer_kind = '__head__' AS is_head,
       coalesce(a.dense_flops_per_token, 0::DOUBLE) AS dense_flops_per_token,
       coalesce(a.dense_weight_bytes, 0::DOUBLE) AS dense_weight_bytes,
       coalesce(a.expert_flops_per_token_per_expert, 0::DOUBLE) AS expert_flops_per_token_per_expert,
       coalesce(a.expert_weight_bytes_per_expert, 0::DOUBLE) AS expert_weight_bytes_per_expert,
       coalesce(a.top_k, 0) AS top_k, coalesce(a.experts, 0) AS experts,
       coalesce(a.shared_expert_flops_per_token, 0::DOUBLE) AS shared_expert_flops_per_token,
       coalesce(a.shared_expert_weight_bytes, 0::DOUBLE) AS shared_expert_weight_bytes,
       coalesce(a.attn_q_heads, 0) AS attn_q_heads, coalesce(a.attn_kv_heads, 0) AS attn_kv_heads,
       coalesce(a.attn_head_dim, 0) AS attn_head_dim, coalesce(a.attn_kind, '') AS attn_kind,
       coalesce(a.attn_window, 0) AS attn_window,
       coalesce(a.attn_index_top_k, 0) AS attn_index_top_k,
       coalesce(a.attn_compress_ratio, 0) AS attn_compress_ratio,
       coalesce(a.attn_kv_lora_rank, 0) AS attn_kv_lora_rank,
       coalesce(a.attentions, 0) AS attentions,
       coalesce(a.non_kv_attentions, 0) AS non_kv_attentions,
       coalesce(a.elementwise_bytes_per_token, 0::DOUBLE) AS elementwise_bytes_per_token,
       coalesce(a.recurrent_kind, '') AS recurrent_kind,
       coalesce(a.recurrent_state_bytes, 0::DOUBLE) AS recurrent_state_bytes,
       coalesce(a.kernels, 0) AS kernels
FROM kinds k LEFT JOIN agg a USING (scenario, pool, layer_kind);

-- Plan totals and the pool-level facts later views test (hybrid, MoE, latent, …).
CREATE OR REPLACE VIEW plan_totals AS
SELECT scenario, pool,
       sum(count) FILTER (WHERE NOT is_head)::BIGINT AS total_layers,
       sum(kernels * count)::BIGINT AS total_kernels,
       (sum(count) FILTER (WHERE NOT is_head)
        + coalesce(sum(count) FILTER (WHERE NOT is_head AND attn_kind = 'sparse_mla'
                                      AND non_kv_attentions > 0), 0) + 1)::BIGINT
           AS piecewise_segments,
       bool_or(recurrent_kind <> '') AS hybrid,
       bool_or(attn_q_heads > 0 AND NOT is_head) AS has_attention,
       bool_or(NOT is_head AND attn_q_heads > 0 AND latent_kind(attn_kind)) AS any_latent,
       coalesce(max(experts) FILTER (WHERE top_k > 0), 0) AS experts,
       list(DISTINCT recurrent_kind) FILTER (WHERE recurrent_kind <> '') AS recurrent_kinds,
       list(DISTINCT attn_kind) FILTER (WHERE attn_kind <> '' AND attn_q_heads > 0)
           AS attention_kinds,
       coalesce(max(CASE WHEN latent_kind(attn_kind) THEN NULL
                         ELSE attn_q_heads * attn_head_dim END)
                FILTER (WHERE attn_q_heads > 0 AND NOT is_head), 0) AS max_attention_width,
       bool_or(NOT is_head AND attn_q_heads > 0 AND latent_kind(attn_kind)) AS latent_width_hit
FROM plan_layers GROUP BY scenario, pool;
