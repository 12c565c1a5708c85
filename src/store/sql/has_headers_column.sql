-- Whether the outbox table has the optional producer-written headers
-- column, carried as message headers ($1: the quoted table name).
SELECT EXISTS (
    SELECT 1 FROM pg_attribute
    WHERE attrelid = $1::text::regclass AND attname = 'headers' AND NOT attisdropped
)
