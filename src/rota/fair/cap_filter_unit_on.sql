-- Fragment of the owner walk's units (alias u: plan_key, unit), after its FROM: leave
-- out the owners at their cap (CTE at_cap) among the special owners, which the walk
-- over fair_owners did not read.
    WHERE NOT EXISTS (SELECT 1 FROM at_cap a
                      WHERE a.plan_key = u.plan_key AND a.unit = u.unit)
