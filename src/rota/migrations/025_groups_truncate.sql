-- A TRUNCATE of rota's groups table fires no row trigger, so fair_groups kept each
-- group's copy of plan, active and owner (fair_copy_group) as it was: the claim's walk
-- and its special groups read that copy, and ranked the groups by plans and owners
-- they no longer had (rota verify reported each copy). A statement trigger makes every
-- copy a missing group's, group by group as a delete does.

CREATE FUNCTION {schema}.fair_groups_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.fair_copy_group(g.group_id, NULL, true, NULL)
    FROM (SELECT DISTINCT f.group_id FROM {schema}.fair_groups f
          WHERE f.plan IS NOT NULL OR NOT f.active OR f.owner_id IS NOT NULL
          ORDER BY f.group_id) g;
    RETURN NULL;
END
$$;

CREATE TRIGGER groups_fair_truncated
    AFTER TRUNCATE ON {schema}.groups
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_groups_truncated();
