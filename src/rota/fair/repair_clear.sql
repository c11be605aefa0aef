-- The rebuild's first step, under repair_lock's locks: forget the served-count deltas,
-- the group rows, the owner rows and the lowered marks (fair_edge and fair_plans stay:
-- any edge is a valid checkpoint, and fair_plans only ever grows).
WITH deltas AS (DELETE FROM {schema}.fair_served RETURNING 1),
owners AS (DELETE FROM {schema}.fair_owners RETURNING 1),
lowered AS (DELETE FROM {schema}.fair_lowered RETURNING 1)
DELETE FROM {schema}.fair_groups
