-- materialize: true
-- Evidence (kernel-behaviour.md §6): entries resting on evidence, the total, assumed names.
CREATE OR REPLACE VIEW evidence AS
SELECT scenario, pool,
       count(*) FILTER (WHERE method IN ('measured', 'literature', 'vendor_spec')) AS evidenced,
       count(*) AS total,
       coalesce(list(name ORDER BY position) FILTER (WHERE method = 'assumed'), [])
           AS assumed_names
FROM provenance GROUP BY scenario, pool;
