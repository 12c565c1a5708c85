-- The relay's two planner settings (Store::new explains both). $1 = false
-- sets them for the session, once per pooled connection; $1 = true sets them
-- for the current transaction only, which is all a transaction pooler
-- allows: a session setting would stay on a server connection that other
-- clients of the pooler get next.
SELECT set_config('plan_cache_mode', 'force_custom_plan', $1),
       set_config('enable_bitmapscan', 'off', $1)
