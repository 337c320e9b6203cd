-- materialize: true
-- DSA sparse-MLA backend selection (model.md §9.7) and KV geometry (§3.1).

CREATE OR REPLACE VIEW pool_dsa_backend AS
WITH r AS (
    SELECT d.scenario, d.pool, d.is_dsa, l.chip,
           CASE WHEN p.cache_dtype = '' THEN 'auto' ELSE p.cache_dtype END AS cache,
           nullif(p.cache_dtype, '') AS stated_cache,
           d.max_sparse_heads // greatest(l.tp, 1) AS heads_per_rank,
           c.tflops_nvfp4 > 0 AS sm100, l.tp, greatest(l.dcp, 1) AS dcp,
           greatest(l.pcp, 1) AS pcp, x.comm_backend,
           l.chip IN ('a100-80', 'a100-sxm', 'l40s') AS pre_hopper
    FROM pool_dtypes d
    JOIN pool_layout l USING (scenario, pool)
    JOIN pools p USING (scenario, pool)
    JOIN chips c ON c.chip = l.chip
    JOIN pool_dcp x USING (scenario, pool)
), q AS (
    SELECT *,
           (starts_with(cache, 'fp8') OR starts_with(cache, 'nvfp4')
            OR ends_with(cache, 'per_token_head')) AS quantized
    FROM r
), cands AS (
    SELECT *,
           CASE WHEN NOT sm100 THEN ['FLASH_ATTN_MLA_SPARSE', 'FLASHMLA_SPARSE',
                                     'FLASHINFER_MLA_SPARSE_SM90']
                WHEN quantized OR heads_per_rank <= 16
                    THEN ['FLASHINFER_MLA_SPARSE', 'FLASHMLA_SPARSE']
                ELSE ['FLASHMLA_SPARSE', 'FLASHINFER_MLA_SPARSE'] END AS priority
    FROM q
), acc AS (
    SELECT *,
           list_filter(priority, lambda b:
               CASE b
                   WHEN 'FLASH_ATTN_MLA_SPARSE' THEN dcp <= 1
                        AND cache IN ('auto', 'float16', 'bfloat16')
                   WHEN 'FLASHMLA_SPARSE' THEN cache IN ('auto', 'bfloat16', 'fp8_ds_mla', 'fp8')
                        OR (sm100 AND cache = 'nvfp4_ds_mla')
                   WHEN 'FLASHINFER_MLA_SPARSE' THEN NOT (pcp > 1 AND dcp > 1)
                        AND cache IN ('auto', 'float16', 'bfloat16', 'fp8', 'fp8_e4m3')
                   WHEN 'FLASHINFER_MLA_SPARSE_SM90' THEN dcp <= 1
                        AND cache IN ('auto', 'bfloat16', 'fp8', 'fp8_e4m3')
                   ELSE false END) AS accepting
    FROM cands
), sel AS (
    SELECT *, CASE WHEN is_dsa THEN accepting[1] ELSE NULL END AS backend FROM acc
), lay AS (
    SELECT *,
           CASE WHEN backend = 'FLASHMLA_SPARSE' AND quantized AND cache <> 'nvfp4_ds_mla'
                THEN 'fp8_ds_mla' ELSE cache END AS layout,
           CASE WHEN heads_per_rank <= 64 THEN 64 ELSE 128 END AS pad_local,
           CASE WHEN pcp <= 1 THEN heads_per_rank * dcp
                WHEN dcp > pcp THEN heads_per_rank * tp
                ELSE heads_per_rank END AS gathered_heads
    FROM sel
)
SELECT scenario, pool, is_dsa, chip, cache, stated_cache, heads_per_rank, sm100, tp, dcp, pcp,
       comm_backend, pre_hopper, quantized, priority, accepting, backend, layout,
       gathered_heads,
       CASE WHEN NOT is_dsa THEN NULL
            WHEN pre_hopper THEN
                'a DSA sparse-MLA model needs a Hopper or newer part: ' || vllm() || ' has no '
                || 'sparse-MLA backend for ' || chip
            WHEN backend IS NULL THEN
                'no sparse-MLA backend in ' || vllm() || ' serves a ''' || cache || ''' cache with dcp '
                || dcp || ', pcp ' || pcp || ' on this part (tried '
                || array_to_string(priority, ', ') || ')'
            WHEN backend = 'FLASHMLA_SPARSE' AND dcp > 1 THEN
                CASE WHEN cache IN ('auto', 'bfloat16', 'float16') THEN
                         'FLASHMLA_SPARSE with decode-context parallelism (dcp ' || dcp
                         || ') needs a quantized cache; a 16-bit ''' || cache
                         || ''' cache is refused by ' || vllm()
                     WHEN comm_backend <> 'ag_rs' THEN
                         'FLASHMLA_SPARSE with decode-context parallelism combines only with '
                         || 'ag_rs; dcp_comm_backend ''' || comm_backend || ''' is refused'
                     WHEN pcp > 1 AND layout <> 'fp8_ds_mla' THEN
                         'FLASHMLA_SPARSE with prefill- and decode-context parallelism needs the '
                         || 'fp8_ds_mla layout; ''' || layout || ''' is refused'
                     WHEN pcp <= 1 AND heads_per_rank >= 32 THEN
                         'FLASHMLA_SPARSE with decode-context parallelism and no PCP needs fewer '
                         || 'than 32 attention heads per rank; this deployment has '
                         || heads_per_rank
                     WHEN pad_local <> (CASE WHEN gathered_heads <= 64 THEN 64 ELSE 128 END) THEN
                         'FLASHMLA_SPARSE pads ' || heads_per_rank || ' local heads to '
                         || pad_local || ' but the ' || gathered_heads || ' gathered heads to '
                         || (CASE WHEN gathered_heads <= 64 THEN 64 ELSE 128 END)
                         || '; ' || vllm() || ' refuses mismatched kernel sizes'
                     ELSE NULL END
            ELSE NULL END AS refusal
FROM lay;

-- KV bytes per token per rank (model.md §3.1 KVBytesPerToken and the packed DSA layouts).
CREATE OR REPLACE VIEW pool_kv AS
WITH k AS (
    SELECT d.scenario, d.pool, d.kv_heads, d.kv_head_dim, d.kv_kind, d.kv_layers, d.cache_bytes,
           d.dcp_shards_all_kv_layers, l.tp,
           CASE WHEN b.is_dsa AND b.backend IS NOT NULL THEN b.layout ELSE d.cache_dtype END
               AS cache_layout
    FROM pool_dtypes d JOIN pool_layout l USING (scenario, pool)
    JOIN pool_dsa_backend b USING (scenario, pool)
)
-- kernel.model.laws.kv_bytes_per_token, the packed DSA layouts included
SELECT *,
       kv_bytes_per_token(kv_heads, tp, kv_head_dim, kv_layers, cache_bytes,
                          latent_kind(kv_kind), cache_layout) AS kv_bytes_per_token
FROM k;
