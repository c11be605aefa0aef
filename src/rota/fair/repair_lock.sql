-- The rebuild's locks (docs/fast-claim.md, "The contract"), first in its transaction,
-- taken in this order: jobs, which waits for every open writer of jobs (their triggers
-- keep the bookkeeping against the tables as they are now) and holds new ones (claims,
-- completions, enqueues) until the rebuild commits; then the bookkeeping tables, which
-- waits for the upkeep (fair_fold, fair_advance) and plan changes
-- (fair_groups_changed). EXCLUSIVE mode lets plain reads on (the dashboard,
-- rota verify) and conflicts with every row lock, so no fold can hold a row the rebuild
-- deletes.
LOCK TABLE {schema}.jobs, {schema}.fair_groups, {schema}.fair_served, {schema}.fair_edge,
    {schema}.fair_plans, {schema}.fair_owners, {schema}.fair_owner_changes,
    {schema}.fair_walk_floor IN EXCLUSIVE MODE
