-- Fragment of cap_tail_on.sql (the group_cap placeholder: a group's cap, over groups
-- rows g) for an application's groups relation, which has no group caps: none.
-- group_cap_on.sql is the other choice.
NULL::int
