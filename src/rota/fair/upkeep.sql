-- Claim upkeep, in a background task (its own short transaction, never the caller's):
-- fold recent changes of served counts into fair_groups.served_n and renew those groups'
-- head bounds and those of groups whose bound ran out (fair_fold), and, when due, move
-- the served window's edge to the window start (fair_advance, try-lock only), so the
-- claim's explicitly handled groups and its edge correction stay few. Neither ever
-- waits.
SELECT {schema}.fair_fold(%(type)s, now() + %(offset)s::interval) AS folded,
       CASE WHEN %(advance)s
            THEN {schema}.fair_advance(%(type)s, now() + %(offset)s::interval
                                                  - %(served_window)s::interval)
       END AS advanced
