-- Pure helper laws used by the views (kernel-algorithm.md §2.3, §1.5, §1.6).

-- The span laws (span_law, flat_span, ring_span, all2all_span) and us_to_ns are not macros:
-- pipeline.db.register_laws binds them to kernel.laws, the one definition Python also prices with.

-- blis-schemas DType.Bytes().
CREATE OR REPLACE MACRO dtype_bytes(d) AS CAST(
    CASE d WHEN 'bf16' THEN 2.0 WHEN 'fp16' THEN 2.0 WHEN 'fp8' THEN 1.0 WHEN 'int8' THEN 1.0
           WHEN 'nvfp4' THEN 0.5 WHEN 'mxfp4' THEN 0.5 WHEN 'int4' THEN 0.5
           WHEN 'fp32' THEN 4.0 ELSE 0.0 END AS DOUBLE);

-- cacheDTypeBytes(declared, fallback bytes) (§1.6, 19ac88e6 form); NULL for an unknown name.
CREATE OR REPLACE MACRO cache_dtype_bytes(declared, fallback) AS CAST(
    CASE WHEN declared IS NULL OR declared IN ('', 'auto')
              THEN CASE WHEN fallback < 2 THEN 2.0 ELSE fallback END
         WHEN declared IN ('fp8', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla') THEN 1.0
         WHEN declared IN ('bfloat16', 'float16') THEN 2.0
         WHEN declared IN ('nvfp4', 'nvfp4_4over6') THEN 0.5625
         WHEN declared = 'nvfp4_ds_mla' THEN 0.5
         WHEN declared = 'float32' THEN 4.0
         ELSE NULL END AS DOUBLE);

-- Go's %v for an int list: [2 4 8].
CREATE OR REPLACE MACRO go_int_list(xs) AS
    '[' || array_to_string(list_transform(xs, lambda x: CAST(x AS VARCHAR)), ' ') || ']';

CREATE OR REPLACE MACRO latent_kind(k) AS k IN ('mla', 'sparse_mla');
CREATE OR REPLACE MACRO dcp_shards_kind(k) AS k IN ('gqa', 'mla', 'sparse_mla');
