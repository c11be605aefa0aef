-- Fragment of claim.sql's blocked CTE (the cap_guard placeholder) for the uncapped
-- statement on rota's own groups table: a need "caps" when any group is capped
-- (groups.max_running; docs/design.md, "Caps"), so this statement claims nothing and
-- FairClaim.claim runs the capped one (and keeps to it). The smallest cap, read through
-- groups_capped_idx (the min/max path: one probe, empty while no group is capped,
-- whatever the statistics; an EXISTS read the whole table when it had none); the answer
-- is this statement's snapshot's, as the claim's others are.
    UNION ALL
    SELECT 'caps' WHERE (SELECT min(g.max_running) FROM {schema}.groups g) IS NOT NULL
