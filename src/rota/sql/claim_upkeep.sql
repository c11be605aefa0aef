-- After a claim (its own short transaction, never the caller's): raise the head bounds
-- of the groups the claim took jobs from (fair_tighten, SKIP LOCKED), and, when due,
-- move the served window's edge to the window start (fair_advance, try-lock only), so
-- the claim's next edge correction stays small. Neither ever waits for a writer.
SELECT {schema}.fair_tighten(%(type)s, %(group_ids)s::text[]) AS tightened,
       CASE WHEN %(advance)s
            THEN {schema}.fair_advance(%(type)s, now() + %(offset)s::interval
                                                  - %(served_window)s::interval)
       END AS advanced
