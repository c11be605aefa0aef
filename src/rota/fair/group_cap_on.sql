-- Fragment of cap_tail_on.sql (the group_cap placeholder: a group's cap, over groups
-- rows g) on rota's own groups table: its max_running (docs/design.md, "Caps").
g.max_running
