-- FOR EACH STATEMENT: one NOTIFY per INSERT statement, however many rows;
-- PostgreSQL also folds identical notifications of one transaction into one.
CREATE TRIGGER {notify_trigger}
    AFTER INSERT ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {notify_function}()
