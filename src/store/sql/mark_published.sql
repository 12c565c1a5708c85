-- Confirmed rows, one statement per batch. The guard keeps a late outcome
-- from touching a row an operator has already dealt with.
UPDATE {table}
SET published_at = now()
WHERE id = ANY($1::uuid[])
  AND published_at IS NULL
