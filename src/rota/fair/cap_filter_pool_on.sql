-- Fragment of the group order's keyed CTE (pool rows, alias pl: group_id): leave out the
-- groups of owners at their cap (CTE at_cap) that the pool did not already (an
-- application's groups relation, read whole; the special groups), their owner read from
-- the groups relation.
      AND NOT EXISTS (
          SELECT 1 FROM {groups} g
          JOIN at_cap a
            ON a.plan_key = 'p:' || g.plan::text
           AND a.unit = CASE WHEN g.owner_id IS NULL THEN 'g:' || g.group_id::text
                             ELSE 'o:' || g.owner_id::text END
          WHERE g.group_id::text = pl.group_id)
