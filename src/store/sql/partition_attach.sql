-- Creates the partition for [{lower}, {upper}) ahead of time, in the
-- caller's transaction (short lock_timeout, retention lock held).
--
-- CREATE TABLE … PARTITION OF would take ACCESS EXCLUSIVE on the parent,
-- queueing every producer behind it; a table made LIKE the parent and
-- then attached takes only SHARE UPDATE EXCLUSIVE on the parent, which
-- INSERTs, claims and updates do not conflict with. The attach does take
-- ACCESS EXCLUSIVE on the DEFAULT partition, whose constraint changes:
-- statements that read the whole table (claims, gauges) wait for it, for
-- as long as the DEFAULT partition takes to scan (normally empty).
-- Producers routing rows to other partitions do not lock it.
--
-- Rows already in DEFAULT for this range (written while no partition
-- covered it) would make the attach fail; they are moved into the new
-- table first, under the same lock, so no statement sees them twice or
-- not at all. The partition gets the parent's indexes (built on attach:
-- the table is empty or holds only the moved rows).
CREATE TABLE IF NOT EXISTS {partition}
    (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    WITH (fillfactor = 50);
LOCK TABLE {table} IN SHARE UPDATE EXCLUSIVE MODE;
LOCK TABLE {default_partition} IN ACCESS EXCLUSIVE MODE;
WITH moved AS (
    DELETE FROM {default_partition}
    WHERE created_at >= {lower} AND created_at < {upper}
    RETURNING *
)
INSERT INTO {partition} SELECT * FROM moved;
ALTER TABLE {table} ATTACH PARTITION {partition} FOR VALUES FROM ({lower}) TO ({upper})
