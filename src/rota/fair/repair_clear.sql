-- The rebuild's first step, under repair_lock's locks: forget the served-count deltas
-- and the group rows (fair_edge and fair_plans stay: any edge is a valid checkpoint,
-- and fair_plans only ever grows).
WITH deltas AS (DELETE FROM {schema}.fair_served RETURNING 1)
DELETE FROM {schema}.fair_groups
