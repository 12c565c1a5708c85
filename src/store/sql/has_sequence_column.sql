-- Whether the outbox table has the optional producer-written
-- sequence_number column that orders rows within an aggregate ($1: the
-- quoted table name).
SELECT EXISTS (
    SELECT 1 FROM pg_attribute
    WHERE attrelid = $1::text::regclass AND attname = 'sequence_number' AND NOT attisdropped
)
