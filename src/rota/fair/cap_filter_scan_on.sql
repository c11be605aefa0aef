-- Fragment of claim_owner_walk_scan.sql's keyed (pool rows, alias pl: plan, unit): leave
-- out the groups of owners at their cap (CTE at_cap).
      AND NOT EXISTS (SELECT 1 FROM at_cap a
                      WHERE a.plan_key = 'p:' || pl.plan AND a.unit = pl.unit)
