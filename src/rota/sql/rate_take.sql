-- Take units of a rate limit (docs/design.md, "Rates"): the rule is the schema's
-- rate_take function, so every caller (runner, handler, CLI, bench) shares one.
SELECT granted, at, wait_s
FROM {schema}.rate_take(%(name)s, %(key)s, %(units)s, %(limit)s, %(per)s, %(burst)s,
                        %(emission)s, %(max_wait)s, %(offset)s)
