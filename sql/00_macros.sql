-- materialize: false
-- Pure helper laws used by the views (kernel-algorithm.md §2.3, §1.5, §1.6).

-- The span laws (span_law, flat_span, ring_span, all2all_span) and us_to_ns are not macros:
-- kernel/sql_laws.py binds them to kernel.laws, the one definition Python also prices with.

-- dtype_bytes(d) and cache_dtype_bytes(declared, fallback) are kernel.laws too, bound by
-- kernel/sql_laws.py: 0.0 for an unknown served dtype, NULL for an unknown cache dtype.

-- Go's %v for an int list: [2 4 8].
CREATE OR REPLACE MACRO go_int_list(xs) AS
    '[' || array_to_string(list_transform(xs, lambda x: CAST(x AS VARCHAR)), ' ') || ']';

CREATE OR REPLACE MACRO latent_kind(k) AS k IN ('mla', 'sparse_mla');
CREATE OR REPLACE MACRO dcp_shards_kind(k) AS k IN ('gqa', 'mla', 'sparse_mla');
