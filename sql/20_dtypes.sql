-- materialize: true
-- Served dtype, compute peak and suffix, cache and state bytes (model.md §3.1, §9.3).

CREATE OR REPLACE VIEW pool_dtypes AS
WITH q AS (
    SELECT p.scenario, p.pool, p.quantization, p.cache_dtype, p.mamba_cache_dtype,
           m.weight_dtype AS checkpoint_dtype, m.model,
           c.tflops_bf16, c.tflops_fp8, c.tflops_nvfp4,
           CASE WHEN p.quantization = '' THEN m.weight_dtype
                WHEN p.quantization IN ('fp8', 'ptpc_fp8', 'fbgemm_fp8', 'modelopt') THEN 'fp8'
                WHEN p.quantization IN ('modelopt_fp4', 'nvfp4') THEN 'nvfp4'
                WHEN p.quantization = 'mxfp4' THEN 'mxfp4'
                WHEN p.quantization IN ('bitsandbytes', 'awq', 'awq_marlin', 'gptq',
                                        'gptq_marlin', 'compressed-tensors') THEN m.weight_dtype
                ELSE NULL END AS served_dtype
    FROM pools p JOIN scenarios s USING (scenario)
    JOIN models m ON m.model = s.model
    JOIN chips c ON c.chip = s.hardware
), fit AS (
    -- kernel.model.laws.dtype_fit: the coefficient suffix and peak the served dtype runs at
    SELECT *, gemm_fit(served_dtype, tflops_bf16, tflops_fp8, tflops_nvfp4) AS fit
    FROM q
)
SELECT f.scenario, f.pool, f.model, f.quantization, f.checkpoint_dtype, f.served_dtype,
       dtype_bytes(f.served_dtype) AS served_bytes,
       dtype_bytes(f.checkpoint_dtype) AS checkpoint_bytes,
       f.fit.suffix AS gemm_suffix, f.fit.peak AS peak_flops,
       f.cache_dtype, f.mamba_cache_dtype,
       cache_dtype_bytes(f.cache_dtype, dtype_bytes(f.served_dtype)) AS cache_bytes,
       cache_dtype_bytes(f.mamba_cache_dtype, 4.0) AS state_bytes,
       g.kv_heads, g.kv_head_dim, g.kv_kind, g.kv_layers, g.max_sparse_heads,
       g.dcp_shards_all_kv_layers,
       (g.kv_kind = 'sparse_mla' AND g.kv_head_dim = 576) AS is_dsa
FROM fit f JOIN model_kv_geometry g USING (model);
