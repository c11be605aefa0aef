-- Planner settings for the claim's transaction only (it is prepared once per connection):
-- a generic plan, whose nested loops and LIMITs do not depend on the bound values (a
-- custom plan is planned again at every claim); and no JIT, whose compile time the cost
-- estimates of a 30-CTE statement trigger while its actual work is small; and the cost
-- of a random page read as for data in memory or on SSD (1.1), so the generic plan walks
-- fair_groups_walk_idx for a plan's first groups at any number of groups, instead of a
-- seq scan and a sort of every group of the plan, which it chose at 10,000 groups
-- (bench/RESULTS.md, "Planner notes").
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true),
       set_config('random_page_cost', '1.1', true)
