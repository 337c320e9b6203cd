-- materialize: true
-- What limits the CUDA graph mode of a pool (model.md §9.5, rules 5 and 8), as the pinned
-- vLLM release declares it. Two tables (created once per database, so a caller may amend them
-- before the views run) and one view; pool_engine (40_engine_defaults.sql) applies them.

-- Rule 5: a configured KV connector whose requires_piecewise_for_cudagraph() is true forces
-- PIECEWISE when full graphs are requested. The base class says false; a connector missing
-- here (out of tree) is taken at that default. MultiConnector is not listed: it needs
-- piecewise when any child does (pool_graph_support).
CREATE TABLE IF NOT EXISTS kv_connector_graph_needs AS
SELECT * FROM (VALUES
    ('DecodeBenchConnector', false, 'the base class default'),
    ('ExampleConnector', false, 'the base class default'),
    ('ExampleHiddenStatesConnector', false, 'the base class default'),
    ('FlexKVConnectorV1', false, 'the base class default'),
    ('HF3FSKVConnector', false, 'the base class default'),
    ('LMCacheConnectorV1', false,
     'piecewise only with use_layerwise in its extra config, which a deployment cannot state'),
    ('LMCacheMPConnector', false, 'the base class default'),
    ('MoRIIOConnector', true,
     'its layerwise KV-transfer hooks run between layers, outside a full CUDA graph replay'),
    ('MooncakeConnector', false, 'the base class default'),
    ('MooncakeStoreConnector', false, 'the base class default'),
    ('NixlConnector', false, 'whole-request transfers outside the forward pass'),
    ('NixlPullConnector', false, 'whole-request transfers outside the forward pass'),
    ('NixlPushConnector', false, 'whole-request transfers outside the forward pass'),
    ('OffloadingConnector', false, 'the base class default'),
    ('SimpleCPUOffloadConnector', false, 'the base class default')
) AS t(connector, needs_piecewise, why);

-- Rule 8: the CUDA-graph support each attention (or recurrent) backend's metadata builder
-- declares (AttentionCGSupport: NEVER < UNIFORM_SINGLE_TOKEN_DECODE < UNIFORM_BATCH <
-- ALWAYS), for the backend the pinned vLLM release selects by default per chip kind (pre_hopper:
-- a100-*, l40s; hopper; blackwell: an NVFP4 peak), layer kind and cache width ('*' = any).
CREATE TABLE IF NOT EXISTS attention_cudagraph_support AS
SELECT * FROM (VALUES
    ('hopper', 'gqa', '*', 'FLASH_ATTN', 'ALWAYS', 'FlashAttention 3'),
    ('hopper', 'swa', '*', 'FLASH_ATTN', 'ALWAYS', 'FlashAttention 3'),
    ('blackwell', 'gqa', '*', 'FLASHINFER', 'UNIFORM_BATCH', 'FlashInfer with TRT-LLM decode'),
    ('blackwell', 'swa', '*', 'FLASHINFER', 'UNIFORM_BATCH', 'FlashInfer with TRT-LLM decode'),
    ('pre_hopper', 'gqa', '16bit', 'FLASH_ATTN', 'UNIFORM_BATCH', 'FlashAttention 2'),
    ('pre_hopper', 'swa', '16bit', 'FLASH_ATTN', 'UNIFORM_BATCH', 'FlashAttention 2'),
    ('pre_hopper', 'gqa', 'fp8', 'FLASHINFER', 'UNIFORM_SINGLE_TOKEN_DECODE',
     'FlashAttention 2 cannot read an fp8 cache, so FlashInfer without TRT-LLM decode'),
    ('pre_hopper', 'swa', 'fp8', 'FLASHINFER', 'UNIFORM_SINGLE_TOKEN_DECODE',
     'FlashAttention 2 cannot read an fp8 cache, so FlashInfer without TRT-LLM decode'),
    ('hopper', 'mla', '16bit', 'FLASH_ATTN_MLA', 'UNIFORM_BATCH', 'FlashAttention 3 MLA'),
    ('hopper', 'mla', 'fp8', 'FLASHMLA', 'UNIFORM_BATCH',
     'FlashMLA; FlashAttention 3 MLA reads no fp8 cache'),
    ('blackwell', 'mla', '*', 'FLASHINFER_MLA', 'UNIFORM_BATCH', 'FlashInfer MLA'),
    ('pre_hopper', 'mla', '*', 'TRITON_MLA', 'UNIFORM_BATCH',
     'Triton MLA, the only MLA backend below Hopper'),
    ('*', 'sparse_mla', '*', 'sparse-MLA backends', 'UNIFORM_BATCH',
     'FLASHMLA_SPARSE, FLASHINFER_MLA_SPARSE(_SM90) and FLASH_ATTN_MLA_SPARSE alike'),
    ('*', 'mamba2', '*', 'MAMBA2', 'UNIFORM_BATCH', 'the Mamba backends'),
    ('*', 'gdn', '*', 'GDN_ATTN', 'UNIFORM_BATCH', 'the Mamba backends'),
    ('*', 'kda', '*', 'KDA', 'UNIFORM_BATCH', 'the Mamba backends')
) AS t(chip_kind, kind, cache, backend, support, why);

-- Per pool: whether a configured connector needs piecewise graphs (and which), and the
-- lowest CUDA-graph support among the backends its layers run on (and which backend).
CREATE OR REPLACE VIEW pool_graph_support AS
WITH p AS (
    SELECT p.scenario, p.pool, s.pd_connector, s.offload_connector,
           CASE WHEN c.tflops_nvfp4 > 0 THEN 'blackwell'
                WHEN c.chip IN ('a100-80', 'a100-sxm', 'l40s') THEN 'pre_hopper'
                ELSE 'hopper' END AS chip_kind,
           CASE WHEN d.cache_bytes < 2 THEN 'fp8' ELSE '16bit' END AS cache_class,
           list_concat(coalesce(t.attention_kinds, []), coalesce(t.recurrent_kinds, []))
               AS kinds
    FROM pools p JOIN scenarios s USING (scenario) JOIN chips c ON c.chip = s.hardware
    JOIN pool_dtypes d USING (scenario, pool) JOIN plan_totals t USING (scenario, pool)
), conn AS (
    -- the stated connectors; a MultiConnector's children are the other stated connectors
    SELECT p.scenario, p.pool, x.connector, coalesce(k.needs_piecewise, false) AS needs,
           coalesce(k.why, 'not a ' || vllm() || ' connector: the base class default') AS why
    FROM p, (SELECT unnest([p.pd_connector, p.offload_connector]) AS connector) x
    LEFT JOIN kv_connector_graph_needs k USING (connector)
    WHERE x.connector NOT IN ('', 'MultiConnector')
), conn_pick AS (
    SELECT scenario, pool, arg_min(connector, connector) FILTER (WHERE needs) AS connector,
           arg_min(why, connector) FILTER (WHERE needs) AS why
    FROM conn GROUP BY scenario, pool
), lv AS (
    SELECT p.scenario, p.pool, k.kind, a.backend, a.support, a.why,
           CASE a.support WHEN 'NEVER' THEN 0 WHEN 'UNIFORM_SINGLE_TOKEN_DECODE' THEN 1
                          WHEN 'UNIFORM_BATCH' THEN 2 WHEN 'ALWAYS' THEN 3 END AS level
    FROM p, (SELECT unnest(p.kinds) AS kind) k
    JOIN attention_cudagraph_support a
      ON a.kind = k.kind AND a.chip_kind IN (p.chip_kind, '*') AND a.cache IN (p.cache_class, '*')
), lv_pick AS (
    SELECT scenario, pool, min(level) AS level,
           arg_min(backend || ' for ' || kind || ' layers (' || why || ')', level)
               AS backend
    FROM lv GROUP BY scenario, pool
)
SELECT p.scenario, p.pool, p.chip_kind, p.cache_class,
       p.pd_connector = 'MultiConnector' OR p.offload_connector = 'MultiConnector'
           AS multi_connector,
       c.connector IS NOT NULL AS connector_needs_piecewise,
       c.connector AS piecewise_connector, c.why AS piecewise_connector_why,
       coalesce(l.level, 3) AS graph_support_level,
       CASE coalesce(l.level, 3) WHEN 0 THEN 'NEVER' WHEN 1 THEN 'UNIFORM_SINGLE_TOKEN_DECODE'
            WHEN 2 THEN 'UNIFORM_BATCH' ELSE 'ALWAYS' END AS graph_support,
       l.backend AS graph_support_backend
FROM p LEFT JOIN conn_pick c USING (scenario, pool) LEFT JOIN lv_pick l USING (scenario, pool);
