-- Fragment of claim.sql's blocked CTE (the cap_guard placeholder) for the uncapped
-- statement on rota's own groups table: a need "caps" when any group is capped
-- (groups.max_running; docs/design.md, "Caps"), so this statement claims nothing and
-- FairClaim.claim runs the capped one (and keeps to it). One probe of groups_capped_idx,
-- empty while no group is capped; the answer is this statement's snapshot's, as the
-- claim's others are.
    UNION ALL
    SELECT 'caps' WHERE EXISTS (SELECT 1 FROM {schema}.groups g
                                WHERE g.max_running IS NOT NULL)
