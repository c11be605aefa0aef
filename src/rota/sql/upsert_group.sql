INSERT INTO {schema}.groups (group_id, owner_id, plan, active, updated_at)
VALUES (%(group_id)s, %(owner_id)s, %(plan)s, %(active)s, now())
ON CONFLICT (group_id) DO UPDATE
SET owner_id = excluded.owner_id, plan = excluded.plan, active = excluded.active,
    updated_at = excluded.updated_at
