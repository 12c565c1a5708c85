-- For the backlog statements (backlog.sql, gauges_read.sql), which are
-- written for scans of the partial indexes stopped by a LIMIT. The planner
-- estimates those indexes' predicates by multiplying the NULL fractions of
-- published_at and quarantined_at as if they were independent. After a mass
-- quarantine that predicts a large pending set where there is almost none,
-- and the LIMIT then makes a sequential scan of the whole table look cheap:
-- at 10 million published and 1 million quarantined rows, a scan of all of
-- them to count a hundred pending ones. Local to the transaction.
SELECT set_config('enable_seqscan', 'off', true)
