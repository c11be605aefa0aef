-- Fragment of a walk over fair_groups (alias f): leave out the groups of owners at their
-- cap (CTE at_cap, cap_prelude_on.sql), inside the walk's LIMIT.
           AND NOT EXISTS (SELECT 1 FROM at_cap a
                           WHERE a.plan_key = f.plan_key AND a.unit = f.unit)
