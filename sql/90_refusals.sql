-- materialize: true
-- Refusals (kernel-algorithm.md §8; kernel-behaviour.md §7): one row per reason a pool cannot
-- be priced. `step` follows the order of New() (§1.2) so the first row is the one the Go
-- kernel would report; build.py raises RefusalError(setting, value, reason) for it.
CREATE OR REPLACE VIEW refusals AS
SELECT * FROM (
    -- step 7: layout
    SELECT scenario, pool, 7.0 AS step, CASE WHEN tp < 1 THEN 'tp' ELSE 'dp' END AS setting,
           CAST(CASE WHEN tp < 1 THEN tp ELSE dp END AS VARCHAR) AS value,
           'resolving the layout: tensor- and data-parallel widths must be at least 1' AS reason
    FROM pools WHERE tp < 1 OR dp < 1
    UNION ALL
    -- step 8: no coefficient in scope at all
    SELECT l.scenario, l.pool, 8.0, 'coefficients',
           (SELECT '[' || string_agg(set, ' ' ORDER BY position) || ']'
            FROM scenario_coefficient_sets s WHERE s.scenario = l.scenario),
           'resolving coefficients: no coefficient in the listed sets applies to hardware='
           || l.chip || ' model=' || l.model || ' tp=' || l.tp || ' ep=' || l.expert_width
           || ' nodes_spanned=' || l.nodes_spanned
    FROM pool_layout l
    WHERE NOT EXISTS (SELECT 1 FROM coefficients_in_scope c
                      WHERE c.scenario = l.scenario AND c.pool = l.pool)
    UNION ALL
    -- step 8.5: a coefficient in scope whose declared units do not measure what its name does
    SELECT c.scenario, c.pool, 8.5, c.name, c.units,
           'resolving coefficients: set ' || c.set || coalesce(' (' || nullif(f.file, '<memory>')
           || ')', '') || ', coefficients[' || c.entry_index || '].' || c.name || '.units is '''
           || c.units || ''', but ' || c.name || ' is '
           || (SELECT any_value(u.quantity_label) FROM coefficient_units u
               WHERE u.quantity = c.quantity)
           || '; accepted units: '
           || (SELECT string_agg(u.unit, ', ' ORDER BY u.position) FROM coefficient_units u
               WHERE u.quantity = c.quantity)
    FROM coefficients_lifted c
    LEFT JOIN loaded_documents f ON f.kind = 'coefficient_set' AND f.name = c.set
    WHERE NOT c.units_fit
    UNION ALL
    -- step 10: served dtype
    SELECT scenario, pool, 10.0, 'quantization', quantization,
           'quantization ''' || quantization || ''' is not one this kernel prices; add it to '
           || 'servedDType with the dtype ' || vllm() || ' serves it at'
    FROM pool_dtypes WHERE served_dtype IS NULL
    UNION ALL
    -- step 11: cache dtypes (first matching rule)
    SELECT scenario, pool, 11.0, setting, value, reason FROM (
        SELECT d.scenario, d.pool,
               CASE WHEN d.cache_dtype = 'fp8_inc' OR (ends_with(d.cache_dtype, '_ds_mla')
                         AND d.kv_kind <> 'sparse_mla')
                         OR (starts_with(d.cache_dtype, 'nvfp4')
                             AND NOT ends_with(d.cache_dtype, '_ds_mla') AND latent_kind(d.kv_kind))
                         OR d.cache_dtype IN ('turboquant_k8v4', 'turboquant_4bit_nc',
                                              'turboquant_k3v4_nc', 'turboquant_3bit_nc',
                                              'int4_per_token_head', 'int8_per_token_head',
                                              'fp8_per_token_head')
                         OR d.cache_dtype NOT IN ('', 'auto', 'float16', 'bfloat16', 'fp8',
                                                  'fp8_e4m3', 'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla',
                                                  'nvfp4_ds_mla', 'nvfp4', 'nvfp4_4over6')
                    THEN 'cache_dtype' ELSE 'mamba_cache_dtype' END AS setting,
               CASE WHEN d.cache_dtype = 'fp8_inc' OR (ends_with(d.cache_dtype, '_ds_mla')
                         AND d.kv_kind <> 'sparse_mla')
                         OR (starts_with(d.cache_dtype, 'nvfp4')
                             AND NOT ends_with(d.cache_dtype, '_ds_mla') AND latent_kind(d.kv_kind))
                         OR d.cache_dtype NOT IN ('', 'auto', 'float16', 'bfloat16', 'fp8',
                                                  'fp8_e4m3', 'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla',
                                                  'nvfp4_ds_mla', 'nvfp4', 'nvfp4_4over6')
                    THEN d.cache_dtype ELSE d.mamba_cache_dtype END AS value,
               CASE WHEN d.cache_dtype = 'fp8_inc' THEN
                        'cache_dtype fp8_inc is served by no CUDA attention backend in ' || vllm()
                    WHEN ends_with(d.cache_dtype, '_ds_mla') AND d.kv_kind <> 'sparse_mla' THEN
                        'cache_dtype ' || d.cache_dtype || ' is served only by the sparse-MLA '
                        || 'backends, and this model''s attention is ''' || d.kv_kind || ''''
                    WHEN starts_with(d.cache_dtype, 'nvfp4')
                         AND NOT ends_with(d.cache_dtype, '_ds_mla') AND latent_kind(d.kv_kind) THEN
                        'cache_dtype ' || d.cache_dtype || ' on a latent-attention model: vLLM '
                        || 'v' || engine_version() || ' refuses plain nvfp4 with MLA'
                    WHEN d.cache_dtype IN ('turboquant_k8v4', 'turboquant_4bit_nc',
                                           'turboquant_k3v4_nc', 'turboquant_3bit_nc',
                                           'int4_per_token_head', 'int8_per_token_head',
                                           'fp8_per_token_head') THEN
                        'cache_dtype ' || d.cache_dtype || ' is a ' || vllm() || ' format this kernel '
                        || 'does not price (it does not size that cache layout)'
                    WHEN d.cache_dtype NOT IN ('', 'auto', 'float16', 'bfloat16', 'fp8',
                                               'fp8_e4m3', 'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla',
                                               'nvfp4_ds_mla', 'nvfp4', 'nvfp4_4over6') THEN
                        'cache_dtype ' || d.cache_dtype || ' is not a ' || vllm() || ' cache dtype'
                    WHEN d.mamba_cache_dtype NOT IN ('', 'auto', 'float32', 'float16', 'bfloat16')
                        THEN 'mamba_cache_dtype ' || d.mamba_cache_dtype || ' is not a vLLM '
                             || 'v' || engine_version() || ' recurrent state dtype'
                    ELSE NULL END AS reason
        FROM pool_dtypes d
    ) WHERE reason IS NOT NULL
    UNION ALL
    -- step 13: pipeline parallelism
    SELECT scenario, pool, 13.0, 'pp', CAST(pp AS VARCHAR),
           'pipeline parallelism (pp ' || pp || ') is not priced by this kernel'
    FROM pools WHERE pp > 1
    UNION ALL
    -- step 14: plan
    SELECT l.scenario, l.pool, 14.0, 'stack', u.layer_kind,
           'planning the model graph: the stack names layer kind ''' || u.layer_kind
           || ''', which the graph does not declare'
    FROM pool_layout l JOIN graph_undeclared_kinds u ON u.model = l.model
    UNION ALL
    SELECT scenario, pool, 14.1, 'emit', emit,
           'planning the model graph: layer kind ''' || layer_kind || ''': node ' || node_index
           || ' (' || op || CASE WHEN role <> '' THEN ' ' || role ELSE '' END
           || ') carries condition ''' || emit || ''', which this resolver cannot evaluate'
    FROM pool_nodes WHERE emitted IS NULL
    UNION ALL
    -- step 16: DSA block size
    SELECT scenario, pool, 16.0, 'block_size', CAST(stated_block_size AS VARCHAR),
           'block_size ' || stated_block_size || ' on a DSA sparse-MLA model: its indexer runs '
           || 'on 64-token kernel blocks, so the block size must be a multiple of 64'
    FROM pool_engine WHERE is_dsa AND stated_block_size % 64 <> 0
    UNION ALL
    -- step 17: context parallelism
    SELECT scenario, pool, 17.0, 'pcp', CAST(pcp AS VARCHAR), reason FROM (
        SELECT l.scenario, l.pool, l.pcp,
               'prefill-context parallelism (pcp ' || l.pcp || ') needs every layer''s backend '
               || 'to support it, and layer kind ''' || arg_min(pl.layer_kind, pl.position)
               || ''' has ' || arg_min(CASE WHEN pl.recurrent_kind <> ''
                                            THEN 'a ' || pl.recurrent_kind || ' recurrent mixer'
                                            ELSE pl.attn_kind || ' attention' END, pl.position)
               AS reason
        FROM pool_layout l JOIN plan_layers pl USING (scenario, pool)
        WHERE l.pcp > 1 AND NOT pl.is_head
          AND ((pl.attn_q_heads > 0 AND NOT latent_kind(pl.attn_kind)) OR pl.recurrent_kind <> '')
        GROUP BY l.scenario, l.pool, l.pcp)
    UNION ALL
    SELECT l.scenario, l.pool, 17.1, 'pcp', CAST(l.pcp AS VARCHAR),
           'prefill- and decode-context parallelism together (pcp ' || l.pcp || ', dcp ' || l.dcp
           || ') run only on DSA sparse-MLA attention in ' || vllm()
    FROM pool_layout l
    WHERE l.pcp > 1 AND l.dcp > 1 AND EXISTS (
        SELECT 1 FROM plan_layers pl WHERE pl.scenario = l.scenario AND pl.pool = l.pool
          AND NOT pl.is_head AND pl.attn_q_heads > 0 AND pl.attn_kind <> 'sparse_mla')
    UNION ALL
    SELECT d.scenario, d.pool, 17.2, 'dcp_q_replicate', 'true',
           'dcp_q_replicate is requested with dcp ' || d.dcp || ' on a latent-attention model: '
           || vllm() || ' ignores it for MLA, so the kernel cannot price what was asked'
    FROM pool_dcp d WHERE coalesce(d.dcp_q_replicate, false) AND d.dcp > 1 AND d.pcp <= 1
      AND d.any_latent
    UNION ALL
    SELECT scenario, pool, 17.3, 'dcp_comm_backend', stated_backend,
           'resolving decode-context parallelism: dcp_comm_backend ''' || stated_backend
           || ''' is not one the rules pack accepts (' || array_to_string(accepted, ', ') || ')'
    FROM pool_dcp WHERE stated_backend IS NOT NULL AND has_accepted_list
      AND NOT list_contains(accepted, stated_backend)
    UNION ALL
    SELECT scenario, pool, 17.4, 'dcp_comm_backend', stated_backend,
           'resolving decode-context parallelism: dcp_comm_backend ''' || stated_backend
           || ''' is not one this kernel prices (ag_rs or a2a)'
    FROM pool_dcp WHERE stated_backend NOT IN ('ag_rs', 'a2a')
    UNION ALL
    SELECT scenario, pool, 17.5, 'dcp_comm_backend', comm_backend,
           'resolving decode-context parallelism: the a2a combine does not run with '
           || 'prefill-context parallelism (pcp ' || pcp || ')'
    FROM pool_dcp WHERE dcp > 1 AND pcp > 1 AND comm_backend = 'a2a'
    UNION ALL
    SELECT scenario, pool, 17.6, 'cp_kv_cache_interleave_size',
           coalesce(CAST(stated_interleave AS VARCHAR), 'unstated'),
           'resolving decode-context parallelism: '
           || CASE WHEN multi_connector AND stated_interleave IS NULL THEN
                       'under a MultiConnector the interleave must be stated and fit block_size '
                       || block
                   WHEN multi_connector THEN
                       'interleave ' || stated_interleave || ' does not fit block_size ' || block
                       || ' (it must be at most, and divide, the block), and a MultiConnector '
                       || 'does not relax that'
                   WHEN block_size_final THEN
                       'interleave ' || stated_interleave || ' does not fit block_size ' || block
                       || ' (it must be at most, and divide, the block)'
                   ELSE 'interleave ' || stated_interleave || ' does not fit the assumed '
                        || 'block_size ' || block || ', and the block size is not confirmable'
              END
    FROM pool_dcp
    WHERE dcp > 1 AND ((stated_interleave IS NOT NULL AND NOT interleave_fits
                        AND (multi_connector OR NOT nixl_connector))
                       OR (stated_interleave IS NULL AND multi_connector))
    UNION ALL
    -- step 18 (lift): bandwidth, peak, GEMM envelope
    SELECT r.scenario, r.pool, 18.00, 'hbm_derate', 'absent',
           'coefficient ''hbm_derate'' is not in the resolved set; available: '
           || coalesce((SELECT string_agg(name, ', ' ORDER BY name) FROM coefficients_in_scope c
                        WHERE c.scenario = r.scenario AND c.pool = r.pool), '')
    FROM resolved_pools r WHERE r.hbm_bps IS NULL
    UNION ALL
    SELECT scenario, pool, 18.01, 'hbm_bps', CAST(hbm_bps AS VARCHAR),
           'HBM bandwidth resolved to ' || hbm_bps || ', which cannot price anything'
    FROM resolved_pools
    WHERE hbm_bps IS NOT NULL AND (hbm_bps <= 0 OR isnan(hbm_bps) OR isinf(hbm_bps))
    UNION ALL
    SELECT scenario, pool, 18.02, 'peak_flops', CAST(peak_flops AS VARCHAR),
           'compute peak resolved to ' || peak_flops || ', which cannot price anything'
    FROM resolved_pools WHERE served_dtype IS NOT NULL AND NOT (peak_flops > 0)
    UNION ALL
    SELECT scenario, pool, 18.03, name, 'absent',
           'no efficiency asymptote / half-max for served dtype ' || d.gemm_suffix || ': '
           || name || ' is not in the scenario''s coefficient sets for this part'
    FROM pool_coefficient_needs n JOIN pool_dtypes d USING (scenario, pool)
    WHERE n.lift_order IN (3, 4) AND NOT n.present AND d.served_dtype IS NOT NULL
    UNION ALL
    SELECT n.scenario, n.pool, 18.05, 'gemm_n_half_' || d.gemm_suffix, 'partial',
           'served dtype ' || d.gemm_suffix || ' has one of gemm_n_half/gemm_k_half but not both'
    FROM (SELECT scenario, pool,
                 bool_or(present) FILTER (WHERE lift_order = 5) AS has_n,
                 bool_or(present) FILTER (WHERE lift_order = 6) AS has_k
          FROM pool_coefficient_needs GROUP BY scenario, pool) n
    JOIN pool_dtypes d USING (scenario, pool)
    WHERE n.has_n <> n.has_k
    UNION ALL
    -- collectives, in key order
    SELECT scenario, pool, 18.07 + key_order / 1000.0, 'collective_width',
           op || '/' || "group" || ' width ' || width, refusal
    FROM collective_keys WHERE refusal IS NOT NULL
    UNION ALL
    -- graph mode and capture sizes
    SELECT scenario, pool, 18.17, 'cudagraph_mode', stated_cudagraph_mode,
           'cudagraph_mode ''' || stated_cudagraph_mode || ''' is not one this kernel prices '
           || '(NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE)'
    FROM pool_engine WHERE NOT cudagraph_mode_known
    UNION ALL
    SELECT scenario, pool, 18.171, 'max_cudagraph_capture_size',
           CAST(stated_max_capture_size AS VARCHAR),
           'max_cudagraph_capture_size ' || stated_max_capture_size || ' differs from the largest '
           || 'stated cudagraph_capture_sizes entry; ' || vllm() || ' refuses the pair'
    FROM pool_engine WHERE cudagraph_mode_known AND capture_conflict
    UNION ALL
    SELECT scenario, pool, 18.172, 'cudagraph_capture_sizes',
           go_int_list(coalesce(stated_capture_sizes, [])),
           'no CUDA graph capture size survives (every size exceeds max_num_batched_tokens, or '
           || 'rounding to the decode query length leaves none); ' || vllm() || ' fails to start'
    FROM pool_engine WHERE cudagraph_mode_known AND captures_graphs AND len(capture_sizes) = 0
    UNION ALL
    -- expert geometry
    SELECT scenario, pool, 18.18, 'ep', CAST(expert_width AS VARCHAR),
           'expert-parallel width ' || expert_width || ' exceeds the model''s ' || total_experts
           || ' physical experts, which would leave ranks with none'
    FROM pool_experts WHERE experts > 0 AND experts_base = 0
    UNION ALL
    SELECT scenario, pool, 18.181, 'cache_dtype', cache, refusal
    FROM pool_dsa_backend WHERE refusal IS NOT NULL
    UNION ALL
    -- memory magnitudes
    SELECT scenario, pool, 18.19 + position / 1000.0, name, 'absent',
           'memory occupancy needs ' || name || '; list cost-model-memory and '
           || 'cost-model-primitives in the scenario''s coefficients'
    FROM pool_memory_names WHERE needed AND NOT present
);
