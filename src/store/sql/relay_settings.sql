-- The relay's settings for its own statements (Store::build explains each):
-- two planner settings, the server-side statement timeout ($2), the
-- bound on any one lock wait ($3) and synchronous_commit ($4; NULL keeps
-- the server's). $1 =
-- false sets them for the session, once per pooled connection; $1 = true
-- sets them for the current transaction only, which is all a transaction
-- pooler allows: a session setting would stay on a server connection that
-- other clients of the pooler get next.
SELECT set_config('plan_cache_mode', 'force_custom_plan', $1),
       set_config('enable_bitmapscan', 'off', $1),
       set_config('statement_timeout', $2, $1),
       set_config('lock_timeout', $3, $1),
       set_config('synchronous_commit', COALESCE($4, current_setting('synchronous_commit')), $1)
