-- Whether one partition may be dropped: it holds no unpublished row
-- (quarantined rows are unpublished too, so a partition with one stays
-- until an operator releases or deletes it), and its last publish is more
-- than $1 milliseconds ago (OUTBOX_RETENTION), so dropping it deletes
-- nothing the row-by-row retention of a plain table would have kept.
--
-- Plan: the first entry of the partition's aggregate index (every
-- unpublished row, quarantined ones included) and the last entry of its
-- published index: two index probes, whatever the partition holds.
SELECT NOT EXISTS (SELECT 1 FROM {partition} WHERE published_at IS NULL)
   AND COALESCE((SELECT max(published_at) FROM {partition} WHERE published_at IS NOT NULL)
                < now() - $1::bigint * interval '1 millisecond', true)
