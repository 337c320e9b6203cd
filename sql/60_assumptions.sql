-- materialize: true
-- The kernel's assumptions, in the order New() records them (kernel-algorithm.md §1.2): each
-- unstated setting the pinned vLLM release defaults, and each optional coefficient priced
-- without.

CREATE OR REPLACE VIEW pool_assumptions AS
SELECT * FROM (
    SELECT scenario, pool, 150 AS seq, 'mamba_cache_mode' AS name,
           recurrent_cache_mode AS value,
           'unstated; ' || vllm() || ' uses align with prefix caching on and none with it off'
               AS reason
    FROM pool_engine WHERE hybrid AND stated_mamba_cache_mode IS NULL
    UNION ALL
    SELECT scenario, pool, 160, 'block_size', CAST(resolved_block_size AS VARCHAR),
           CASE WHEN is_dsa THEN 'unstated; a DSA sparse-MLA indexer runs only on 64-token blocks'
                ELSE 'unstated; ' || vllm() || ' DEFAULT_BLOCK_SIZE' END
    FROM pool_engine WHERE stated_block_size IS NULL
    UNION ALL
    SELECT scenario, pool, 170, 'dcp_comm_backend', stated_backend,
           'stated, but the rules pack lists no accepted backends to check it against'
    FROM pool_dcp WHERE stated_backend IS NOT NULL AND NOT has_accepted_list
    UNION ALL
    SELECT scenario, pool, 171, 'dcp_comm_backend', comm_backend,
           'unstated; ' || vllm() || ' combines decode-context partials with all-gather + '
           || 'reduce-scatter'
    FROM pool_dcp WHERE dcp > 1 AND stated_backend IS NULL
    UNION ALL
    SELECT scenario, pool, 1000 + lift_order, name, 'absent', 'priced as ' || reason
    FROM pool_coefficient_needs WHERE needed AND NOT required AND NOT present
    UNION ALL
    SELECT scenario, pool, 1900, 'cudagraph_mode', 'FULL_AND_PIECEWISE',
           'unstated; the -O2 default of ' || vllm()
    FROM pool_engine WHERE stated_cudagraph_mode IS NULL
    UNION ALL
    SELECT scenario, pool, 1901, 'max_num_seqs', CAST(resolved_max_num_seqs AS VARCHAR),
           'unstated; ' || vllm() || '''s default for a part with this much memory'
    FROM pool_engine WHERE stated_max_num_seqs IS NULL
    UNION ALL
    SELECT scenario, pool, 1902, 'max_cudagraph_capture_size', CAST(capture_tokens AS VARCHAR),
           vllm() || '''s default capture sizes: min(max_num_seqs x decode query length x 2, '
           || platform_capture_cap || ') on its size grid, capped by max_num_batched_tokens'
    FROM pool_engine
    WHERE captures_graphs AND stated_max_capture_size IS NULL AND stated_capture_sizes IS NULL
    UNION ALL
    SELECT scenario, pool, 1903, 'mla_context_chunk', CAST(mla_context_chunk_max() AS VARCHAR),
           'no max_model_len is stated, so the context-gather chunk is taken at its largest'
    FROM pool_mla_chunk WHERE chunk_assumed
    UNION ALL
    SELECT scenario, pool, 1910, 'sparse_mla_backend', backend,
           'DSA on Hopper selects FlashInfer''s SM90 sparse-MLA backend, which needs '
           || 'FlashInfer >= '
           || (SELECT flashinfer_sm90_sparse_mla_version FROM kernel_constants)
    FROM pool_dsa_backend WHERE backend = 'FLASHINFER_MLA_SPARSE_SM90'
    UNION ALL
    SELECT scenario, pool, 2000, 'max_num_batched_tokens',
           CAST(resolved_max_num_batched_tokens AS VARCHAR),
           'unstated; the kernel''s default for a part with this much memory'
    FROM pool_engine WHERE stated_max_num_batched_tokens IS NULL
    UNION ALL
    SELECT p.scenario, p.pool, 2100, 'engine_version', engine_version(),
           'the scenario declares engine_version ' || s.engine_version
           || '; the kernel prices ' || vllm() || ' behaviour'
    FROM pools p JOIN scenarios s USING (scenario) WHERE s.engine_version <> engine_version()
);
