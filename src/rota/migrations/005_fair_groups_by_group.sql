-- A groups-table change (plan, pause, rename, delete) updates that group's fair_groups
-- rows of every type (fair_groups_changed, by group_id alone): without this index each
-- changed group read all of fair_groups, so changing the plans of N groups at once cost
-- N scans of it (docs/design.md, "The fair claim").
CREATE INDEX fair_groups_group_idx ON {schema}.fair_groups (group_id);
