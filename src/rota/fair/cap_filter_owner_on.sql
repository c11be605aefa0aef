-- Fragment of the owner walk over fair_owners, or over owners' rows, (alias o, columns
-- plan_key and unit): leave out the owners at their cap (CTE at_cap), inside the walk's
-- LIMIT.
              AND NOT EXISTS (SELECT 1 FROM at_cap a
                              WHERE a.plan_key = o.plan_key AND a.unit = o.unit)
