-- materialize: true
-- One row per pool: every scalar kernel.model.resolved.ResolvedPool carries, gathered from the
-- layout, dtype, engine, KV, expert and coefficient views. Unstated is NULL, never 0 or '': a
-- width, limit or setting the scenario does not state, an optional coefficient its sets do not
-- hold, a mode that does not apply (pipeline/unstated.py lists these columns and what the
-- kernel's dataclasses hold instead).

CREATE OR REPLACE VIEW resolved_pools AS
WITH cv AS (
    SELECT scenario, pool,
           max(value) FILTER (WHERE name = 'hbm_derate') AS hbm_derate,
           max(ns_value) FILTER (WHERE name = 'attention_decode_floor_swa') AS attn_floor_swa_ns,
           max(ns_value) FILTER (WHERE name = 'attention_decode_floor_mla') AS attn_floor_mla_ns,
           max(ns_value) FILTER (WHERE name = 'attention_decode_floor_sparse_mla')
               AS attn_floor_sparse_mla_ns,
           -- per decode request of a full-attention layer (the measured layer, decision AC4)
           max(ns_value) FILTER (WHERE name = 'attention_decode_per_request')
               AS attention_per_request_ns,
           -- 1: routed expert FLOPs split over the tp slices of each expert (decision MO1)
           max(value) FILTER (WHERE name = 'moe_expert_tp_split') AS moe_expert_tp_split,
           -- vLLM's fused MoE layer fitted from its operator rows (decision MF1)
           max(ns_value) FILTER (WHERE name = 'moe_fused_floor') AS moe_fused_floor_ns,
           max(si_value) FILTER (WHERE name = 'moe_fused_weight_rate') AS moe_fused_rate_bps,
           max(value) FILTER (WHERE name = 'moe_fused_efficiency') AS moe_fused_efficiency
    FROM coefficients_lifted GROUP BY scenario, pool
), need AS (
    SELECT scenario, pool,
           max(value) FILTER (WHERE lift_order = 3) AS eps_max,
           max(value) FILTER (WHERE lift_order = 4) AS m_half,
           max(value) FILTER (WHERE lift_order = 5) AS n_half,
           max(value) FILTER (WHERE lift_order = 6) AS k_half,
           max(ns_value) FILTER (WHERE name = 'attention_decode_floor') AS attention_floor_ns,
           max(si_value) FILTER (WHERE name = 'attention_decode_rate') AS attention_rate_bps,
           max(si_value) FILTER (WHERE name = 'attention_decode_rate_swa') AS attn_rate_swa,
           max(si_value) FILTER (WHERE name = 'attention_decode_rate_mla') AS attn_rate_mla,
           max(si_value) FILTER (WHERE name = 'attention_decode_rate_sparse_mla')
               AS attn_rate_sparse_mla,
           max(ns_value) FILTER (WHERE name = 'attention_prefill_floor')
               AS attention_prefill_floor_ns,
           max(value) FILTER (WHERE name = 'attention_prefill_work_scale')
               AS attention_prefill_scale,
           max(si_value) FILTER (WHERE name = 'host_link_bandwidth') AS host_link_bps,
           max(value) FILTER (WHERE name = 'moe_routing_imbalance_median') AS moe_imbalance_raw,
           max(ns_value) FILTER (WHERE name = 'recurrent_decode_floor_mamba2') AS rec_floor_mamba2,
           max(si_value) FILTER (WHERE name = 'recurrent_decode_rate_mamba2') AS rec_rate_mamba2,
           max(ns_value) FILTER (WHERE name = 'recurrent_decode_floor_kda') AS rec_floor_kda,
           max(si_value) FILTER (WHERE name = 'recurrent_decode_rate_kda') AS rec_rate_kda,
           max(ns_value) FILTER (WHERE name = 'recurrent_decode_floor_gdn') AS rec_floor_gdn,
           max(si_value) FILTER (WHERE name = 'recurrent_decode_rate_gdn') AS rec_rate_gdn,
           max(ns_value) FILTER (WHERE name = 'host_admission_per_token') AS host_admission_per_token_ns,
           max(ns_value) FILTER (WHERE name = 'host_admission_per_request')
               AS host_admission_per_request_ns,
           max(ns_value) FILTER (WHERE name = 'host_output_token') AS host_output_token_ns,
           max(ns_value) FILTER (WHERE name = 'host_completion') AS host_completion_ns,
           max(ns_value) FILTER (WHERE name = 'host_launch_eager_per_layer')
               AS host_launch_eager_per_layer_ns,
           max(ns_value) FILTER (WHERE name = 'host_launch_per_kernel') AS host_launch_per_kernel_ns,
           max(ns_value) FILTER (WHERE name = 'host_replay_graph_per_step')
               AS host_replay_graph_per_step_ns
    FROM pool_coefficient_needs GROUP BY scenario, pool
), mem AS (
    SELECT scenario, pool,
           max(CASE WHEN needed THEN value ELSE 0 END) FILTER (WHERE magnitude = 'comm_bytes')
               AS comm_bytes_raw,
           max(value) FILTER (WHERE magnitude = 'workspace_bytes') AS workspace_bytes_raw,
           max(value) FILTER (WHERE magnitude = 'capture_bytes') AS capture_bytes_raw,
           max(value) FILTER (WHERE magnitude = 'activation_buffers') AS activation_buffers,
           max(value) FILTER (WHERE magnitude = 'activation_floor') AS activation_floor
    FROM pool_memory_names GROUP BY scenario, pool
)
SELECT l.scenario, l.pool, l.role, l.chip, l.model, l.tp, l.pp, l.dp,
       nullif(l.pcp, 0) AS pcp, nullif(l.dcp, 0) AS dcp,
       l.expert_width, l.moe_group_width, l.moe_group, l.gpus_per_node,
       nullif(l.gpus_per_rack, 0) AS gpus_per_rack,
       l.nodes_spanned, l.enable_expert_parallel,
       nullif(l.all2all_backend, '') AS all2all_backend, l.sequence_parallel_moe,
       a.custom_all_reduce, l.rack_is_one_domain, l.intra_node_bw_gbps,
       nullif(l.inter_node_bw_gbps, 0) AS inter_node_bw_gbps,
       c.sm_count AS chip_sm_count, c.memory_gib AS chip_memory_gib,
       nullif(c.tflops_nvfp4, 0) AS chip_nvfp4_tflops,
       d.served_dtype, d.served_bytes, d.checkpoint_bytes, d.gemm_suffix, d.peak_flops,
       c.bw_peak_tbs * 1e12 * cv.hbm_derate AS hbm_bps,
       c.bw_peak_tbs * 1e12 AS chip_hbm_peak_bps,
       n.eps_max, n.m_half, CAST(n.n_half AS DOUBLE) AS n_half, CAST(n.k_half AS DOUBLE) AS k_half,
       (n.n_half IS NOT NULL AND n.k_half IS NOT NULL) AS shape_aware,
       c.intra_node_bw_gbps * 1e9 AS nvlink_bps,
       CASE WHEN l.inter_node_bw_gbps * 1e9 <= 0 THEN c.intra_node_bw_gbps * 1e9
            ELSE l.inter_node_bw_gbps * 1e9 END AS nic_bps,
       n.attention_floor_ns, n.attention_rate_bps, n.attn_rate_swa, n.attn_rate_mla, n.attn_rate_sparse_mla,
       cv.attn_floor_swa_ns, cv.attn_floor_mla_ns, cv.attn_floor_sparse_mla_ns,
       cv.attention_per_request_ns, cv.moe_expert_tp_split,
       cv.moe_fused_floor_ns, cv.moe_fused_rate_bps, cv.moe_fused_efficiency,
       n.attention_prefill_floor_ns, n.attention_prefill_scale, n.host_link_bps,
       CASE WHEN n.moe_imbalance_raw > 0 THEN n.moe_imbalance_raw ELSE CAST(1 AS DOUBLE) END AS moe_imbalance,
       n.rec_floor_mamba2, n.rec_rate_mamba2, n.rec_floor_kda, n.rec_rate_kda, n.rec_floor_gdn,
       n.rec_rate_gdn,
       n.host_admission_per_token_ns, n.host_admission_per_request_ns, n.host_output_token_ns,
       n.host_completion_ns, n.host_launch_eager_per_layer_ns, n.host_launch_per_kernel_ns,
       n.host_replay_graph_per_step_ns,
       x.experts, x.total_experts, x.experts_per_rank, x.expert_tensor_shards, x.redundant,
       CASE WHEN x.experts > 0 THEN x.experts_per_rank / x.total_experts ELSE 1.0 END
           AS local_expert_share,
       k.kv_bytes_per_token, k.kv_layers, k.dcp_shards_all_kv_layers, d.cache_bytes,
       nullif(k.cache_layout, '') AS cache_layout, d.state_bytes,
       e.resolved_block_size AS block_size, e.block_size_final,
       nullif(e.max_model_len, 0) AS max_model_len,
       e.resolved_max_num_batched_tokens AS max_num_batched_tokens,
       e.resolved_max_num_seqs AS max_num_seqs, e.num_spec_tokens, e.uniform_decode_width,
       e.decode_graph_mode, e.other_graph_mode, e.resolved_cudagraph_mode AS cudagraph_mode,
       e.capture_tokens, e.capture_sizes,
       nullif(e.recurrent_cache_mode, '') AS recurrent_cache_mode,
       dc.comm_backend AS dcp_comm_backend, dc.interleave AS dcp_interleave,
       mc.mla_context_chunk, e.resolved_async_scheduling AS async_scheduling,
       e.resolved_cascade_attention AS cascade_attention,
       CAST(trunc(coalesce(m.comm_bytes_raw, 0)) AS BIGINT) AS comm_bytes,
       CAST(trunc(coalesce(m.workspace_bytes_raw, 0)) AS BIGINT) AS workspace_bytes,
       CAST(trunc(coalesce(m.capture_bytes_raw, 0)) AS BIGINT) AS capture_bytes,
       coalesce(m.activation_buffers, 0.0) AS activation_buffers,
       coalesce(m.activation_floor, 0.0) AS activation_floor,
       CASE WHEN greatest(t.max_attention_width,
                          CASE WHEN t.latent_width_hit THEN mo.hidden_size ELSE 0 END) = 0
            THEN mo.hidden_size
            ELSE greatest(t.max_attention_width,
                          CASE WHEN t.latent_width_hit THEN mo.hidden_size ELSE 0 END) END
           AS activation_width,
       mo.vocab_size, mo.hidden_size,
       t.total_layers, t.total_kernels, t.piecewise_segments, t.hybrid,
       ds.backend AS sparse_mla_backend
FROM pool_layout l
JOIN pool_allreduce a USING (scenario, pool)
JOIN chips c ON c.chip = l.chip
JOIN models mo ON mo.model = l.model
JOIN pool_dtypes d USING (scenario, pool)
LEFT JOIN cv USING (scenario, pool)
JOIN need n USING (scenario, pool)
JOIN mem m USING (scenario, pool)
JOIN pool_experts x USING (scenario, pool)
JOIN pool_kv k USING (scenario, pool)
JOIN pool_engine e USING (scenario, pool)
JOIN pool_dcp dc USING (scenario, pool)
JOIN pool_mla_chunk mc USING (scenario, pool)
JOIN plan_totals t USING (scenario, pool)
JOIN pool_dsa_backend ds USING (scenario, pool);
