-- After a claim, in a background task (its own short transaction, never the caller's):
-- renew the head bounds of the groups the claim took jobs from and of up to 100 groups
-- whose bound ran out (fair_tighten), fold the recent completions into
-- fair_groups.done_n (fair_fold), and, when due, move the served window's edge to the
-- window start (fair_advance, try-lock only), so the claim's explicitly handled groups
-- and its edge correction stay few. None of them ever waits for a writer.
SELECT {schema}.fair_tighten(
           %(type)s,
           %(group_ids)s::text[] || ARRAY(
               SELECT fg.group_id FROM {schema}.fair_groups fg
               WHERE fg.type = %(type)s AND fg.head_until <= now() + %(offset)s::interval
               ORDER BY fg.head_until LIMIT 100),
           now() + %(offset)s::interval) AS tightened,
       {schema}.fair_fold(%(type)s) AS folded,
       CASE WHEN %(advance)s
            THEN {schema}.fair_advance(%(type)s, now() + %(offset)s::interval
                                                  - %(served_window)s::interval)
       END AS advanced
