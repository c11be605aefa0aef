-- Caps per group (docs/design.md, "Caps"): groups.max_running caps one group of rota's
-- own groups table (every type) at N jobs running with a fresh lock; null is no cap.
-- The claim locks each capped group among its candidates through fair_cap_lock (plan_key
-- '', unit 'c:' || group_id) and counts its running jobs (jobs_running_group_idx), as
-- for a plan's owners. groups_capped_idx keeps an uncapped claim's check for any capped
-- group, and the walk's capped groups, an index probe. A change of max_running alone
-- fires groups_fair_changed, which finds no fair_groups row to change.

ALTER TABLE {schema}.groups ADD COLUMN max_running integer
    CONSTRAINT groups_max_running_check CHECK (max_running > 0);
CREATE INDEX groups_capped_idx ON {schema}.groups (group_id) WHERE max_running IS NOT NULL;
