-- Caps per group (docs/design.md, "Caps"): groups.max_running caps one group of rota's
-- own groups table (every type) at N jobs running with a fresh lock; null is no cap.
-- The claim locks each capped group among its candidates through fair_cap_lock (plan_key
-- '', unit 'c:' || group_id) and counts its running jobs (jobs_running_group_idx), as
-- for a plan's owners. groups_capped_idx (the caps set) keeps an uncapped claim's check
-- for any capped group, and the capped claim's gate on the groups at their cap, one probe:
-- each reads the smallest cap through it (min(max_running): the planner's min/max path,
-- whatever the statistics; an EXISTS over max_running IS NOT NULL read the whole table on
-- a table never analyzed). A change of max_running alone
-- fires groups_fair_changed, which finds no fair_groups row to change.

ALTER TABLE {schema}.groups ADD COLUMN max_running integer
    CONSTRAINT groups_max_running_check CHECK (max_running > 0);
CREATE INDEX groups_capped_idx ON {schema}.groups (max_running)
    WHERE max_running IS NOT NULL;
