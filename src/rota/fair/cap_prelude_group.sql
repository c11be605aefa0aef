-- Fragment of cap_prelude_on.sql (the cap_prelude_group placeholder) for an
-- application's groups relation, which has no group caps (docs/design.md, "Caps"): no
-- group is at its cap. cap_prelude_group_on.sql is the other choice.
-- Defines: CTE at_cap_group(group_id).
at_cap_group AS (
    SELECT NULL::text AS group_id WHERE false
),
