-- Whether the NOTIFY trigger is installed on the outbox table ($1: the
-- table's name as text, $2: the trigger's name).
SELECT EXISTS (
    SELECT 1 FROM pg_trigger WHERE tgrelid = $1::text::regclass AND tgname = $2
)
