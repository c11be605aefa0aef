-- Create or update a group of rota's own groups table, every field written (max_running:
-- the group's cap, null for none; docs/design.md, "Caps").
INSERT INTO {schema}.groups (group_id, owner_id, plan, active, max_running, updated_at)
VALUES (%(group_id)s, %(owner_id)s, %(plan)s, %(active)s, %(max_running)s, now())
ON CONFLICT (group_id) DO UPDATE
SET owner_id = excluded.owner_id, plan = excluded.plan, active = excluded.active,
    max_running = excluded.max_running, updated_at = excluded.updated_at
