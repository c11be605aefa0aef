-- Planner settings for the claim's transaction only (it is prepared once per connection):
-- a generic plan, whose nested loops and LIMITs do not depend on the bound values (a
-- custom plan costs about 9 ms of planning per claim at 10,000 groups); and no JIT,
-- whose compile time (about 100 ms) the cost estimates of a 30-CTE statement trigger
-- while its actual work is a few milliseconds.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true)
