-- After a claim (its own short transaction, never the caller's): raise the head bounds
-- of the groups the claim took jobs from (fair_tighten), fold the recent completions
-- into fair_groups.done_n (fair_fold), and, when due, move the served window's edge to
-- the window start (fair_advance, try-lock only), so the claim's sets of groups with
-- unfolded counts and its edge correction stay small. None of them ever waits.
SELECT {schema}.fair_tighten(%(type)s, %(group_ids)s::text[]) AS tightened,
       {schema}.fair_fold(%(type)s) AS folded,
       CASE WHEN %(advance)s
            THEN {schema}.fair_advance(%(type)s, now() + %(offset)s::interval
                                                  - %(served_window)s::interval)
       END AS advanced
