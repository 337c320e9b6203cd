-- materialize: true
-- Provenance (model.md §9.10): every coefficient in scope in
-- ascending name order, then the kernel's assumptions in the order they were recorded.
-- `scope` is the reference's text ("hardware: <first>", "<value>: <reason>"); the typed
-- columns beside it hold the value as a number with its units, the scope axis with all of its
-- values, and an assumption's reason on its own (docs/tables.md).
CREATE OR REPLACE VIEW provenance AS
SELECT scenario, pool, row_number() OVER (PARTITION BY scenario, pool ORDER BY grp, ord, name)
           AS position,
       name, set,
       -- the registry's methods, and `fitted` for a calibration's entries (Kernel.provenance)
       CAST(method AS ENUM('measured', 'literature', 'vendor_spec', 'copied', 'assumed',
                           'not_charged', 'fitted')) AS method,
       scope, kind, value, units, value_text,
       CAST(scope_kind AS ENUM('hardware', 'model', 'unscoped', 'assumption')) AS scope_kind,
       scope_values, reason
FROM (
    SELECT scenario, pool, 0 AS grp, 0 AS ord, name, set, method,
           provenance_scope AS scope, 'coefficient' AS kind, CAST(value AS DOUBLE) AS value,
           units, CAST(value AS VARCHAR) AS value_text,
           provenance_scope_kind AS scope_kind, provenance_scope_values AS scope_values,
           reason
    FROM provenance_coefficients
    UNION ALL
    SELECT scenario, pool, 1, seq, name, assumption_set(), 'assumed',
           value || ': ' || reason, 'assumption', TRY_CAST(value AS DOUBLE), CAST(NULL AS VARCHAR),
           value, 'assumption', []::VARCHAR[], reason
    FROM pool_assumptions
);
