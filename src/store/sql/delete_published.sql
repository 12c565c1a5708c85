-- OUTBOX_ON_PUBLISH=delete: confirmed rows go at once, one statement per batch.
DELETE FROM {table}
WHERE id = ANY($1::uuid[])
