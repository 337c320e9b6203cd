-- materialize: true
-- Settings the engine changes from what the scenario states, with the reason, in the order
-- New() records them (kernel.model.resolved overrides).

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
    WHERE hybrid AND stated_mamba_cache_mode IS NOT NULL
      AND stated_mamba_cache_mode <> recurrent_cache_mode
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
    WHERE is_dsa AND backend IS NOT NULL AND stated_cache IS NOT NULL AND layout <> stated_cache
);
