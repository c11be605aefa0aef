-- Fragment of a walk over fair_groups (alias f): leave out the groups of owners at their
-- cap (CTE at_cap, cap_prelude_on.sql) and the groups at their own cap (at_cap_group),
-- inside the walk's LIMIT. Used by fair_by "group" only, whose keys are per group: a
-- group left out moves no other group's key.
           AND NOT EXISTS (SELECT 1 FROM at_cap a
                           WHERE a.plan_key = f.plan_key AND a.unit = f.unit)
           AND NOT EXISTS (SELECT 1 FROM at_cap_group a WHERE a.group_id = f.group_id)
