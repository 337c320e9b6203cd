-- materialize: true
-- Evidence (kernel-behaviour.md §6): entries resting on evidence, the total, assumed names.
CREATE OR REPLACE VIEW evidence AS
SELECT scenario, pool,
       -- the evidenced methods are pipeline.constants.EVIDENCED_METHODS, via kernel_constants
       count(*) FILTER (WHERE CAST(method AS VARCHAR) IN (
           SELECT unnest(evidenced_methods) FROM kernel_constants)) AS evidenced,
       count(*) AS total,
       coalesce(list(name ORDER BY position) FILTER (WHERE method = 'assumed'), [])
           AS assumed_names
FROM provenance GROUP BY scenario, pool;
