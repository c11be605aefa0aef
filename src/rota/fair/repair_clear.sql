-- The rebuild's first step, under repair_lock's locks: forget the served-count deltas,
-- the group rows, the owner rows, their changes and the walks' floors (fair_edge and
-- fair_plans stay: any edge is a valid checkpoint, and fair_plans only ever grows).
WITH deltas AS (DELETE FROM {schema}.fair_served RETURNING 1),
floors AS (DELETE FROM {schema}.fair_walk_floor RETURNING 1),
owners AS (DELETE FROM {schema}.fair_owners RETURNING 1),
changes AS (DELETE FROM {schema}.fair_owner_changes RETURNING 1)
DELETE FROM {schema}.fair_groups
