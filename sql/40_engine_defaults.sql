-- materialize: true
-- Engine settings after resolution (model.md §9.1 steps 15–17, §9.5, §9.6–§9.7;
-- model.md §9.5–§9.6): each unstated setting gets the pinned vLLM release's default (an assumption
-- row in `assumptions`), each stated one the engine changes gets an override row.

CREATE OR REPLACE VIEW pool_engine AS
WITH e AS (
    SELECT p.*, l.tp AS l_tp, l.moe_group, l.chip, l.routed_all2all,
           c.memory_gib, c.tflops_nvfp4,
           t.hybrid, t.experts, t.any_latent, t.has_attention,
           d.is_dsa,
           coalesce(p.enable_prefix_caching, true) AS prefix_caching,
           s.pd_connector, s.offload_connector,
           g.connector_needs_piecewise, g.piecewise_connector, g.piecewise_connector_why,
           g.graph_support_level, g.graph_support, g.graph_support_backend
    FROM pools p
    JOIN pool_layout l USING (scenario, pool)
    JOIN scenarios s USING (scenario)
    JOIN chips c ON c.chip = s.hardware
    JOIN plan_totals t USING (scenario, pool)
    JOIN pool_dtypes d USING (scenario, pool)
    JOIN pool_graph_support g USING (scenario, pool)
), r1 AS (
    SELECT *,
           -- recurrent cache mode (model.md §9.1 step 15, 19ac88e6 form)
           CASE WHEN NOT hybrid THEN ''
                WHEN hybrid AND prefix_caching
                     AND (CASE WHEN mamba_cache_mode = '' THEN 'none' ELSE mamba_cache_mode END)
                         = 'none' THEN 'align'
                WHEN mamba_cache_mode = '' THEN 'none'
                ELSE mamba_cache_mode END AS recurrent_cache_mode,
           -- block size (model.md §9.1 step 16)
           (NOT hybrid AND (block_size > 0 OR is_dsa)) AS block_size_final,
           CASE WHEN block_size > 0 THEN block_size WHEN is_dsa THEN 64 ELSE 16 END
               AS resolved_block_size,
           -- scheduler budgets (model.md §9.5): the stated ones, else kernel.model.laws' defaults
           CASE WHEN max_num_batched_tokens > 0 THEN max_num_batched_tokens
                ELSE default_max_num_batched_tokens(memory_gib, chip) END
               AS resolved_max_num_batched_tokens,
           CASE WHEN max_num_seqs > 0 THEN max_num_seqs
                ELSE default_max_num_seqs(memory_gib, chip) END AS resolved_max_num_seqs,
           -- CUDA graph mode (model.md §9.5 rule 7: DeepEP high-throughput with DP > 1 on an
           -- MoE graph runs with no graphs)
           CASE WHEN cudagraph_mode = '' THEN 'FULL_AND_PIECEWISE' ELSE upper(cudagraph_mode) END
               AS requested_cudagraph_mode,
           (enable_expert_parallel AND all2all_backend = 'deepep_high_throughput' AND dp > 1
            AND experts > 0) AS deepep_ht_no_graphs,
           CASE WHEN speculative_method <> '' AND num_spec_tokens > 0 THEN 1 + num_spec_tokens
                ELSE 1 END AS uniform_decode_width,
           tflops_nvfp4 > 0 AS blackwell_family_100,
           platform_capture_cap(tflops_nvfp4 > 0) AS platform_capture_cap,
           ('MultiConnector' IN (pd_connector, offload_connector)) AS multi_connector,
           ('NixlConnector' IN (pd_connector, offload_connector)) AS nixl_connector
    FROM e
), r2 AS (
    SELECT *,
           requested_cudagraph_mode IN ('PIECEWISE', 'FULL', 'FULL_AND_PIECEWISE',
                                        'FULL_DECODE_ONLY', 'NONE') AS cudagraph_mode_known,
           -- model.md §9.5 rule 5: a connector that needs piecewise graphs, with full ones
           -- requested
           CASE WHEN connector_needs_piecewise
                     AND requested_cudagraph_mode IN ('FULL', 'FULL_AND_PIECEWISE',
                                                      'FULL_DECODE_ONLY') THEN 'PIECEWISE'
                ELSE requested_cudagraph_mode END AS mode_after_connector
    FROM r1
), r2b AS (
    SELECT *,
           -- rule 7: DeepEP high-throughput with DP > 1 on an MoE graph: no graphs
           CASE WHEN deepep_ht_no_graphs THEN 'NONE' ELSE mode_after_connector END
               AS mode_after_deepep
    FROM r2
), r2c AS (
    SELECT *,
           -- rule 8 (default compilation: attention is a splitting op), first: mixed FULL on a
           -- backend below ALWAYS runs FULL_AND_PIECEWISE
           CASE WHEN mode_after_deepep = 'FULL' AND graph_support_level < 3
                THEN 'FULL_AND_PIECEWISE' ELSE mode_after_deepep END AS mode_after_mixed
    FROM r2b
), r2d AS (
    SELECT *,
           -- then: decode FULL on a backend that supports no graphs runs PIECEWISE
           CASE WHEN mode_after_mixed IN ('FULL', 'FULL_AND_PIECEWISE', 'FULL_DECODE_ONLY')
                     AND graph_support_level = 0 THEN 'PIECEWISE'
                ELSE mode_after_mixed END AS mode_after_never
    FROM r2c
), r2e AS (
    SELECT *,
           -- then: decode FULL with a decode query of q > 1 tokens (speculative decoding) on
           -- a backend below UNIFORM_BATCH runs PIECEWISE
           CASE WHEN mode_after_never IN ('FULL', 'FULL_AND_PIECEWISE', 'FULL_DECODE_ONLY')
                     AND uniform_decode_width > 1 AND graph_support_level < 2 THEN 'PIECEWISE'
                ELSE mode_after_never END AS resolved_cudagraph_mode
    FROM r2d
), r3 AS (
    SELECT *,
           CASE resolved_cudagraph_mode WHEN 'PIECEWISE' THEN 'PIECEWISE' WHEN 'FULL' THEN 'FULL'
               WHEN 'FULL_AND_PIECEWISE' THEN 'FULL' WHEN 'FULL_DECODE_ONLY' THEN 'FULL'
               ELSE 'NONE' END AS decode_graph_mode,
           CASE resolved_cudagraph_mode WHEN 'PIECEWISE' THEN 'PIECEWISE' WHEN 'FULL' THEN 'FULL'
               WHEN 'FULL_AND_PIECEWISE' THEN 'PIECEWISE' ELSE 'NONE' END AS other_graph_mode
    FROM r2e
), r4 AS (
    SELECT *,
           -- vLLM's capture sizes (model.md §9.6), from kernel.model.laws.capture_sizes; empty when vLLM
           -- would refuse (90_refusals.sql reports it)
           capture_sizes(resolved_max_num_seqs, uniform_decode_width,
                         resolved_max_num_batched_tokens, max_cudagraph_capture_size,
                         cudagraph_capture_sizes, blackwell_family_100,
                         decode_graph_mode = 'FULL') AS capture_sizes,
           coalesce(list_max(list_filter(cudagraph_capture_sizes,
                                         lambda x: x <= resolved_max_num_batched_tokens)), 0)
               AS stated_capture_largest
    FROM r3
)
-- stated_* is NULL where the scenario does not state the setting (so is recurrent_cache_mode
-- for a model with no recurrent layers).
SELECT scenario, pool, hybrid, prefix_caching,
       nullif(mamba_cache_mode, '') AS stated_mamba_cache_mode,
       nullif(recurrent_cache_mode, '') AS recurrent_cache_mode, is_dsa,
       CASE WHEN block_size > 0 THEN block_size END AS stated_block_size, block_size_final,
       resolved_block_size,
       CASE WHEN max_num_batched_tokens > 0 THEN max_num_batched_tokens END
           AS stated_max_num_batched_tokens,
       resolved_max_num_batched_tokens,
       CASE WHEN max_num_seqs > 0 THEN max_num_seqs END AS stated_max_num_seqs,
       resolved_max_num_seqs, nullif(cudagraph_mode, '') AS stated_cudagraph_mode,
       requested_cudagraph_mode,
       cudagraph_mode_known, deepep_ht_no_graphs, mode_after_connector, mode_after_deepep,
       mode_after_mixed, mode_after_never, piecewise_connector, piecewise_connector_why,
       graph_support_level, graph_support, graph_support_backend,
       resolved_cudagraph_mode, decode_graph_mode,
       other_graph_mode, lower(resolved_cudagraph_mode) AS graph_mode_name,
       uniform_decode_width, num_spec_tokens, platform_capture_cap,
       max_cudagraph_capture_size AS stated_max_capture_size,
       cudagraph_capture_sizes AS stated_capture_sizes, capture_sizes,
       NOT (decode_graph_mode = 'NONE' AND other_graph_mode = 'NONE') AS captures_graphs,
       CASE WHEN decode_graph_mode = 'NONE' AND other_graph_mode = 'NONE' THEN 0
            ELSE coalesce(list_max(capture_sizes), 0) END AS capture_tokens,
       (max_cudagraph_capture_size IS NOT NULL AND cudagraph_capture_sizes IS NOT NULL
        AND max_cudagraph_capture_size <> stated_capture_largest) AS capture_conflict,
       max_model_len, multi_connector, nixl_connector, any_latent,
       async_scheduling, disable_cascade_attn,
       coalesce(async_scheduling, true) AS resolved_async_scheduling,
       CASE WHEN disable_cascade_attn IS NULL THEN false ELSE NOT disable_cascade_attn END
           AS resolved_cascade_attention
FROM r4;

-- Decode-context parallelism (model.md §9.7 resolveContextParallel / ResolveDecodeContext).
CREATE OR REPLACE VIEW pool_dcp AS
WITH b AS (
    SELECT p.scenario, p.pool, p.dcp, p.pcp, nullif(p.dcp_comm_backend, '') AS stated_backend,
           CASE WHEN p.cp_kv_cache_interleave_size > 0 THEN p.cp_kv_cache_interleave_size END
               AS stated_interleave, p.dcp_q_replicate,
           e.resolved_block_size AS block, e.block_size_final, e.multi_connector,
           e.nixl_connector, e.any_latent,
           (SELECT list(value ORDER BY position) FROM rules r
            WHERE r.version = s.rules_version AND r.category = 'dcp_comm_backends') AS accepted
    FROM pools p JOIN pool_engine e USING (scenario, pool) JOIN scenarios s USING (scenario)
)
SELECT *,
       coalesce(len(accepted), 0) > 0 AS has_accepted_list,
       coalesce(stated_backend, 'ag_rs') AS comm_backend,
       CASE WHEN stated_interleave > 0 THEN stated_interleave <= block AND block % stated_interleave = 0
            ELSE false END
           AS interleave_fits,
       CASE WHEN dcp <= 1 THEN 1
            WHEN stated_interleave > 0 THEN stated_interleave
            WHEN nixl_connector AND NOT multi_connector AND block > 1 THEN block
            ELSE 1 END AS interleave,
       (dcp > 1 AND stated_interleave IS NULL AND nixl_connector AND NOT multi_connector
        AND block > 1) AS interleave_overridden
FROM b;

-- MLA context-gather chunk (model.md §9.7, 19ac88e6 with alignment), from kernel.model.laws.
CREATE OR REPLACE VIEW pool_mla_chunk AS
SELECT e.scenario, e.pool,
       mla_context_chunk(e.max_model_len, e.resolved_max_num_seqs, e.resolved_block_size, d.dcp,
                         d.interleave) AS mla_context_chunk,
       (e.max_model_len <= 0 AND d.dcp > 1 AND e.any_latent) AS chunk_assumed
FROM pool_engine e JOIN pool_dcp d USING (scenario, pool);
