DROP TRIGGER IF EXISTS {notify_trigger} ON {table}
