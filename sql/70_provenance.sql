-- Provenance (kernel-algorithm.md §7; kernel-behaviour.md §6): every coefficient in scope in
-- ascending name order, then the kernel's assumptions in the order they were recorded.
CREATE OR REPLACE VIEW provenance AS
SELECT scenario, pool, row_number() OVER (PARTITION BY scenario, pool ORDER BY grp, ord, name)
           AS position,
       name, set, method, scope, kind, value
FROM (
    SELECT scenario, pool, 0 AS grp, 0 AS ord, name, set, method,
           provenance_scope AS scope, 'coefficient' AS kind, CAST(value AS VARCHAR) AS value
    FROM provenance_coefficients
    UNION ALL
    SELECT scenario, pool, 1, seq, name, 'blis-latency-kernel', 'assumed',
           value || ': ' || reason, 'assumption', value
    FROM pool_assumptions
);
