-- materialize: true
-- Model-level facts from the graph alone (model.md §3.1, §9.4).

-- Each stacked layer kind: how many times it occurs and where it first appears.
CREATE OR REPLACE VIEW graph_kind_counts AS
SELECT model, layer_kind, count(*) AS count, min(position) AS first_position
FROM graph_stack GROUP BY model, layer_kind;

-- Stack entries naming a layer kind the graph does not declare (a refusal).
CREATE OR REPLACE VIEW graph_undeclared_kinds AS
SELECT DISTINCT s.model, s.layer_kind
FROM graph_stack s
LEFT JOIN graph_layer_kinds k ON k.model = s.model AND k.layer_kind = s.layer_kind
WHERE k.layer_kind IS NULL;

-- Per layer kind: the first attention node with an empty role (the KV holder), if any.
CREATE OR REPLACE VIEW graph_kind_primary_attention AS
SELECT model, layer_kind, kind_position, node_index, kind, n_q, n_kv, d_h
FROM (
    SELECT *, row_number() OVER (PARTITION BY model, layer_kind ORDER BY node_index) AS rn
    FROM graph_nodes WHERE op = 'Attention' AND role = '' AND layer_kind <> '__head__'
) WHERE rn = 1;

-- kvGeometry: the last KV-holding kind in declaration order defines (n_kv, head_dim, kind);
-- layers = Σ stack counts of KV-holding kinds.
CREATE OR REPLACE VIEW model_kv_geometry AS
WITH kv AS (
    SELECT a.*, coalesce(c.count, 0) AS count FROM graph_kind_primary_attention a
    LEFT JOIN graph_kind_counts c USING (model, layer_kind)
)
SELECT m.model,
       coalesce(arg_max(kv.n_kv, kv.kind_position), 0) AS kv_heads,
       coalesce(arg_max(kv.d_h, kv.kind_position), 0) AS kv_head_dim,
       coalesce(arg_max(kv.kind, kv.kind_position), '') AS kv_kind,
       coalesce(sum(kv.count), 0)::BIGINT AS kv_layers,
       coalesce(max(kv.n_q) FILTER (WHERE kv.kind = 'sparse_mla' AND kv.count > 0), 0)
           AS max_sparse_heads,
       coalesce(bool_and(dcp_shards_kind(kv.kind)) FILTER (WHERE kv.count > 0 AND kv.n_q > 0),
                true) AS dcp_shards_all_kv_layers
FROM models m LEFT JOIN kv USING (model)
GROUP BY m.model;
