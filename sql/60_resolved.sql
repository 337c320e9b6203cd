-- Overrides, assumptions and the one-row-per-pool resolution record (kernel.resolved).

CREATE OR REPLACE VIEW pool_overrides AS
SELECT * FROM (
    SELECT a.scenario, a.pool, 10 AS seq, 'allreduce_backend' AS field, 'custom' AS requested,
           'nccl' AS resolved, a.override_reason AS reason
    FROM pool_allreduce a WHERE a.override_reason IS NOT NULL
    UNION ALL
    SELECT scenario, pool, 15, 'cudagraph_mode', requested_cudagraph_mode, mode_after_connector,
           'the KV connector ' || piecewise_connector || ' needs piecewise CUDA graphs ('
           || piecewise_connector_why || '), so ' || vllm() || ' captures no full graphs'
    FROM pool_engine WHERE mode_after_connector <> requested_cudagraph_mode
    UNION ALL
    SELECT scenario, pool, 20, 'cudagraph_mode', mode_after_connector, 'NONE',
           'all2all_backend deepep_high_throughput with data parallelism on an MoE graph: '
           || vllm() || ' runs it with no CUDA graphs'
    FROM pool_engine WHERE deepep_ht_no_graphs AND mode_after_connector <> 'NONE'
    UNION ALL
    SELECT scenario, pool, 21, 'cudagraph_mode', mode_after_deepep, mode_after_mixed,
           graph_support_backend || ' supports CUDA graphs only up to ' || graph_support
           || ', below ALWAYS, so ' || vllm() || ' runs mixed batches piecewise'
    FROM pool_engine WHERE mode_after_mixed <> mode_after_deepep
    UNION ALL
    SELECT scenario, pool, 22, 'cudagraph_mode', mode_after_mixed, mode_after_never,
           graph_support_backend || ' supports no CUDA graphs (NEVER), so ' || vllm() || ' '
           || 'captures decode piecewise'
    FROM pool_engine WHERE mode_after_never <> mode_after_mixed
    UNION ALL
    SELECT scenario, pool, 23, 'cudagraph_mode', mode_after_never, resolved_cudagraph_mode,
           'speculative decoding makes a decode step ' || uniform_decode_width
           || ' tokens per request, and ' || graph_support_backend || ' supports CUDA graphs '
           || 'only up to ' || graph_support || ', below UNIFORM_BATCH, so ' || vllm() || ' '
           || 'captures decode piecewise'
    FROM pool_engine WHERE resolved_cudagraph_mode <> mode_after_never
    UNION ALL
    SELECT scenario, pool, 30, 'mamba_cache_mode', stated_mamba_cache_mode, recurrent_cache_mode,
           'prefix caching is on, and ' || vllm() || ' caches a hybrid model''s recurrent state '
           || 'only in align mode'
    FROM pool_engine
    WHERE hybrid AND stated_mamba_cache_mode <> '' AND stated_mamba_cache_mode <> recurrent_cache_mode
    UNION ALL
    SELECT scenario, pool, 40, 'cp_kv_cache_interleave_size', 'unstated (engine default 1)',
           CAST(interleave AS VARCHAR),
           'a NixlConnector moves whole KV blocks, so ' || vllm() || ' sets the decode-context '
           || 'interleave to the block size (' || block || ')'
    FROM pool_dcp WHERE interleave_overridden
    UNION ALL
    SELECT scenario, pool, 50, 'cache_dtype', stated_cache, layout,
           backend || ' stores a quantized sparse-MLA cache in the packed ' || layout
           || ' layout on this part'
    FROM pool_dsa_backend
    WHERE is_dsa AND backend IS NOT NULL AND stated_cache <> '' AND layout <> stated_cache
);

-- The kernel's assumptions, in the order New() records them (kernel-algorithm.md §1.2).
CREATE OR REPLACE VIEW pool_assumptions AS
SELECT * FROM (
    SELECT scenario, pool, 150 AS seq, 'mamba_cache_mode' AS name,
           recurrent_cache_mode AS value,
           'unstated; ' || vllm() || ' uses align with prefix caching on and none with it off'
               AS reason
    FROM pool_engine WHERE hybrid AND stated_mamba_cache_mode = ''
    UNION ALL
    SELECT scenario, pool, 160, 'block_size', CAST(resolved_block_size AS VARCHAR),
           CASE WHEN is_dsa THEN 'unstated; a DSA sparse-MLA indexer runs only on 64-token blocks'
                ELSE 'unstated; ' || vllm() || ' DEFAULT_BLOCK_SIZE' END
    FROM pool_engine WHERE stated_block_size <= 0
    UNION ALL
    SELECT scenario, pool, 170, 'dcp_comm_backend', stated_backend,
           'stated, but the rules pack lists no accepted backends to check it against'
    FROM pool_dcp WHERE stated_backend <> '' AND NOT has_accepted_list
    UNION ALL
    SELECT scenario, pool, 171, 'dcp_comm_backend', comm_backend,
           'unstated; ' || vllm() || ' combines decode-context partials with all-gather + '
           || 'reduce-scatter'
    FROM pool_dcp WHERE dcp > 1 AND stated_backend = ''
    UNION ALL
    SELECT scenario, pool, 1000 + lift_order, name, 'absent', 'priced as ' || reason
    FROM pool_coefficient_needs WHERE needed AND NOT required AND NOT present
    UNION ALL
    SELECT scenario, pool, 1900, 'cudagraph_mode', 'FULL_AND_PIECEWISE',
           'unstated; the -O2 default of ' || vllm()
    FROM pool_engine WHERE stated_cudagraph_mode = ''
    UNION ALL
    SELECT scenario, pool, 1901, 'max_num_seqs', CAST(resolved_max_num_seqs AS VARCHAR),
           'unstated; ' || vllm() || '''s default for a part with this much memory'
    FROM pool_engine WHERE stated_max_num_seqs <= 0
    UNION ALL
    SELECT scenario, pool, 1902, 'max_cudagraph_capture_size', CAST(capture_tokens AS VARCHAR),
           vllm() || '''s default capture sizes: min(max_num_seqs x decode query length x 2, '
           || platform_capture_cap || ') on its size grid, capped by max_num_batched_tokens'
    FROM pool_engine
    WHERE captures_graphs AND stated_max_capture_size IS NULL AND stated_capture_sizes IS NULL
    UNION ALL
    SELECT scenario, pool, 1903, 'mla_context_chunk', '65536',
           'no max_model_len is stated, so the context-gather chunk is taken at its largest'
    FROM pool_mla_chunk WHERE chunk_assumed
    UNION ALL
    SELECT scenario, pool, 1910, 'sparse_mla_backend', backend,
           'DSA on Hopper selects FlashInfer''s SM90 sparse-MLA backend, which needs '
           || 'FlashInfer >= 0.6.18'
    FROM pool_dsa_backend WHERE backend = 'FLASHINFER_MLA_SPARSE_SM90'
    UNION ALL
    SELECT scenario, pool, 2000, 'max_num_batched_tokens',
           CAST(resolved_max_num_batched_tokens AS VARCHAR),
           'unstated; the kernel''s default for a part with this much memory'
    FROM pool_engine WHERE stated_max_num_batched_tokens <= 0
    UNION ALL
    SELECT p.scenario, p.pool, 2100, 'engine_version', engine_version(),
           'the scenario declares engine_version ' || s.engine_version
           || '; the kernel prices ' || vllm() || ' behaviour'
    FROM pools p JOIN scenarios s USING (scenario) WHERE s.engine_version <> engine_version()
);

-- Expert geometry (§1.7).
CREATE OR REPLACE VIEW pool_experts AS
WITH x AS (
    SELECT l.scenario, l.pool, t.experts, l.expert_width, l.tp, l.dp,
           CASE WHEN p.eplb_enable THEN p.eplb_num_redundant_experts ELSE 0 END AS redundant
    FROM pool_layout l JOIN plan_totals t USING (scenario, pool) JOIN pools p USING (scenario, pool)
)
SELECT scenario, pool, experts, redundant, expert_width,
       CASE WHEN expert_width <= 1 THEN tp * greatest(dp, 1) ELSE 1 END AS expert_tensor_shards,
       CASE WHEN experts > 0 THEN experts + redundant ELSE 0 END AS total_experts,
       CASE WHEN experts > 0 THEN (experts + redundant) // greatest(expert_width, 1) ELSE 0 END
           AS experts_base,
       CASE WHEN experts > 0 THEN (experts + redundant) // greatest(expert_width, 1)
                 + (CASE WHEN (experts + redundant) % greatest(expert_width, 1) <> 0 THEN 1
                         ELSE 0 END)
            ELSE 0 END AS experts_per_rank
FROM x;

-- One row per pool: every scalar ResolvedPool carries.
CREATE OR REPLACE VIEW resolved_pools AS
WITH cv AS (
    SELECT scenario, pool,
           max(value) FILTER (WHERE name = 'hbm_derate') AS hbm_derate,
           max(ns_value) FILTER (WHERE name = 'attention_decode_floor_swa') AS attn_floor_swa_ns,
           max(ns_value) FILTER (WHERE name = 'attention_decode_floor_mla') AS attn_floor_mla_ns,
           max(ns_value) FILTER (WHERE name = 'attention_decode_floor_sparse_mla')
               AS attn_floor_sparse_mla_ns
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
SELECT l.scenario, l.pool, l.role, l.chip, l.model, l.tp, l.pp, l.dp, l.pcp, l.dcp,
       l.expert_width, l.moe_group_width, l.moe_group, l.gpus_per_node, l.gpus_per_rack,
       l.nodes_spanned, l.enable_expert_parallel, l.all2all_backend, l.sequence_parallel_moe,
       a.custom_all_reduce, l.rack_is_one_domain, l.intra_node_bw_gbps, l.inter_node_bw_gbps,
       c.sm_count AS chip_sm_count, c.memory_gib AS chip_memory_gib,
       c.tflops_nvfp4 AS chip_nvfp4_tflops,
       d.served_dtype, d.served_bytes, d.checkpoint_bytes, d.gemm_suffix, d.peak_flops,
       c.bw_peak_tbs * 1e12 * cv.hbm_derate AS hbm_bps,
       c.bw_peak_tbs * 1e12 AS chip_hbm_peak_bps,
       n.eps_max, n.m_half, coalesce(n.n_half, 0)::DOUBLE AS n_half, coalesce(n.k_half, 0)::DOUBLE AS k_half,
       (n.n_half IS NOT NULL AND n.k_half IS NOT NULL) AS shape_aware,
       c.intra_node_bw_gbps * 1e9 AS nvlink_bps,
       CASE WHEN l.inter_node_bw_gbps * 1e9 <= 0 THEN c.intra_node_bw_gbps * 1e9
            ELSE l.inter_node_bw_gbps * 1e9 END AS nic_bps,
       coalesce(n.attention_floor_ns, 0) AS attention_floor_ns,
       coalesce(n.attention_rate_bps, 0.0) AS attention_rate_bps,
       n.attn_rate_swa, n.attn_rate_mla, n.attn_rate_sparse_mla,
       cv.attn_floor_swa_ns, cv.attn_floor_mla_ns, cv.attn_floor_sparse_mla_ns,
       coalesce(n.attention_prefill_floor_ns, 0) AS attention_prefill_floor_ns,
       coalesce(n.attention_prefill_scale, 0.0) AS attention_prefill_scale,
       coalesce(n.host_link_bps, 0.0) AS host_link_bps,
       CASE WHEN n.moe_imbalance_raw > 0 THEN n.moe_imbalance_raw ELSE CAST(1 AS DOUBLE) END AS moe_imbalance,
       n.rec_floor_mamba2, n.rec_rate_mamba2, n.rec_floor_kda, n.rec_rate_kda, n.rec_floor_gdn,
       n.rec_rate_gdn,
       coalesce(n.host_admission_per_token_ns, 0) AS host_admission_per_token_ns,
       coalesce(n.host_admission_per_request_ns, 0) AS host_admission_per_request_ns,
       coalesce(n.host_output_token_ns, 0) AS host_output_token_ns,
       coalesce(n.host_completion_ns, 0) AS host_completion_ns,
       coalesce(n.host_launch_eager_per_layer_ns, 0) AS host_launch_eager_per_layer_ns,
       coalesce(n.host_launch_per_kernel_ns, 0) AS host_launch_per_kernel_ns,
       coalesce(n.host_replay_graph_per_step_ns, 0) AS host_replay_graph_per_step_ns,
       x.experts, x.total_experts, x.experts_per_rank, x.expert_tensor_shards, x.redundant,
       CASE WHEN x.experts > 0 THEN x.experts_per_rank / x.total_experts ELSE 1.0 END
           AS local_expert_share,
       k.kv_bytes_per_token, k.kv_layers, k.dcp_shards_all_kv_layers, d.cache_bytes,
       k.cache_layout, d.state_bytes,
       e.resolved_block_size AS block_size, e.block_size_final, e.max_model_len,
       e.resolved_max_num_batched_tokens AS max_num_batched_tokens,
       e.resolved_max_num_seqs AS max_num_seqs, e.num_spec_tokens, e.uniform_decode_width,
       e.decode_graph_mode, e.other_graph_mode, e.resolved_cudagraph_mode AS cudagraph_mode,
       e.capture_tokens, e.capture_sizes, e.recurrent_cache_mode,
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
