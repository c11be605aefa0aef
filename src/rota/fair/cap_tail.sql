-- Fragment of claim.sql (the cap_tail placeholder) when no plan caps its owners'
-- running jobs: the candidates are the best `candidates` jobs read, and every unread
-- bound counts. cap_tail_on.sql is the other choice.
-- Needs:   CTEs ordered, unread; parameter candidates.
-- Defines: CTEs cand (ordered's columns), unread_open(priority, v, fair, created_at, id,
--          need), cap_slots(id, plan, owner): none (the claimed jobs hold no slot).
cand AS (
    SELECT o.* FROM ordered o WHERE o.ord <= %(candidates)s
),
unread_open AS (
    SELECT u.priority, u.v, u.fair, u.created_at, u.id, u.need FROM unread u
),
cap_slots AS (
    SELECT NULL::bigint AS id, NULL::text AS plan, NULL::text AS owner WHERE false
),
