-- Planner settings for the claim's transaction only (it is prepared once per connection):
-- a generic plan, whose nested loops and LIMITs do not depend on the bound values (a
-- custom plan is planned again at every claim); and no JIT, whose compile time the cost
-- estimates of a 30-CTE statement trigger while its actual work is small
-- (bench/RESULTS.md, "Planner notes").
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true)
