-- Ahead of claim.sql (its finish placeholder): the rows the broker
-- confirmed in the worker's previous batch ($5 ids, $6 the attempts their
-- claim counted), marked or deleted by mark_published.sql or
-- delete_published.sql (pasted in below), in the statement that claims the
-- next batch. A batch then costs one statement and one commit fewer; the
-- confirmed rows stay leased until this runs, which is moments later, and
-- are recorded on their own whenever the worker is not about to claim.
-- Both statements see one snapshot: a row recorded here is not yet
-- published for an ordered claim, so ordered claims do not use this.
finished AS (
{record}
),
