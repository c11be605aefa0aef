-- The slot a running job holds (docs/design.md, "Caps"; docs/fast-claim.md, "Caps"): the
-- capped claim writes on each job it takes the plan and owner ('o:' || owner_id, or
-- 'g:' || group_id for a group without one) whose cap the job counts against, as its
-- candidates' groups said; the uncapped claim writes nulls. The capped claim's owners at
-- their cap (cap_prelude_on.sql, at_cap) are then counted from the running jobs of the
-- capped plans alone (jobs_running_slot_idx), each checked against its group's plan and
-- owner as the statement's snapshot sees them, where every running job of every type
-- had its group looked up (bench/RESULTS.md, section 26). A job whose group has moved
-- since its claim counts for no one there, and one claimed by the uncapped claim is not
-- counted at all: both leave an owner out of that set, never put one in, which costs the
-- claim a probe, never exactness (each capped owner among the candidates is still
-- locked and counted exactly, fair_cap_lock). Nulls on the jobs of before.

ALTER TABLE {schema}.jobs ADD COLUMN slot_plan text, ADD COLUMN slot_owner text;
CREATE INDEX jobs_running_slot_idx ON {schema}.jobs (slot_plan, locked_at)
    WHERE status = 'running' AND slot_plan IS NOT NULL;
