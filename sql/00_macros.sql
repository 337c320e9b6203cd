-- materialize: false
-- Pure helper laws used by the views (model.md §5.5, §9.3).

-- The span laws (span_law, flat_span, ring_span, all2all_span) and us_to_ns are not macros:
-- kernel/pool/sql_laws.py binds them to kernel.model.laws, the one definition Python also prices with.

-- dtype_bytes(d) and cache_dtype_bytes(declared, fallback) are kernel.model.laws too, bound by
-- kernel/pool/sql_laws.py: 0.0 for an unknown served dtype, NULL for an unknown cache dtype.

-- So are go_int_list(xs) (Go's %v of an int list), latent_kind(k), dcp_shards_kind(k) and
-- every other law the views call (dtype fit, default budgets, KV bytes, width snapping,
-- fabric ratio, the rules pack's two rules): kernel/pool/sql_laws.py lists them all, and
-- tests/test_one_definition.py fails if a SQL copy of one comes back.
