//! Migration files read as statements, with the index statements picked
//! out: `migrate` builds indexes `CONCURRENTLY`, which PostgreSQL refuses
//! inside a transaction, so they cannot run with the rest of their file.
//! And since an index may be missing or invalid whatever the history says
//! (an interrupted build, a name an older version cut short), the indexes
//! every migration wants are gathered into one [`IndexPlan`] that is
//! checked on every run.

/// One statement of a migration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement<'a> {
    /// `CREATE [UNIQUE] INDEX [CONCURRENTLY] [IF NOT EXISTS] name ON rest`.
    CreateIndex(IndexSpec<'a>),
    /// `DROP INDEX [CONCURRENTLY] [IF EXISTS] name [, …] [RESTRICT]`.
    DropIndex(Vec<&'a str>),
    /// Anything else: a catalog change, run in the migration's transaction.
    Catalog(&'a str),
}

/// An index as a migration declares it, names and table still placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexSpec<'a> {
    /// `CREATE UNIQUE INDEX`.
    pub unique: bool,
    /// The name as written, e.g. `{pending_index}`.
    pub name: &'a str,
    /// Everything after `ON`: the table, columns and predicate.
    pub on: &'a str,
}

/// Splits SQL text at the semicolons that end statements: not those in
/// comments, quoted literals and identifiers, or dollar-quoted bodies
/// (a function's `$$ … $$`). Blank and comment-only pieces are left out.
pub fn split(sql: &str) -> Vec<&str> {
    let bytes = sql.as_bytes();
    let mut statements = Vec::new();
    let (mut start, mut at) = (0, 0);
    while at < bytes.len() {
        let rest = &sql[at..];
        at += if rest.starts_with("--") {
            rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            rest.find("*/").map_or(rest.len(), |end| end + 2)
        } else if rest.starts_with('\'') || rest.starts_with('"') {
            // A doubled quote inside is two quoted runs back to back.
            let quote = &rest[..1];
            rest[1..].find(quote).map_or(rest.len(), |end| end + 2)
        } else if let Some(tag) = dollar_tag(rest) {
            rest[tag.len()..]
                .find(tag)
                .map_or(rest.len(), |end| end + 2 * tag.len())
        } else if rest.starts_with(';') {
            statements.push(&sql[start..at]);
            start = at + 1;
            1
        } else {
            // Validated SQL files are mostly ASCII; step a whole character.
            rest.chars().next().map_or(1, char::len_utf8)
        };
    }
    statements.push(&sql[start..]);
    statements
        .into_iter()
        .map(str::trim)
        .filter(|statement| !strip_comments(statement).is_empty())
        .collect()
}

/// `$$` or `$tag$` at the start of `text`.
fn dollar_tag(text: &str) -> Option<&str> {
    let body = text.strip_prefix('$')?;
    let end = body.find('$')?;
    let tag = &body[..end];
    let identifier = tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !tag.starts_with(|c: char| c.is_ascii_digit());
    identifier.then(|| &text[..end + 2])
}

/// The statement without the comments and blanks in front of it.
fn strip_comments(mut text: &str) -> &str {
    loop {
        text = text.trim_start();
        if let Some(rest) = text.strip_prefix("--") {
            text = rest.find('\n').map_or("", |end| &rest[end..]);
        } else if let Some(rest) = text.strip_prefix("/*") {
            text = rest.find("*/").map_or("", |end| &rest[end + 2..]);
        } else {
            return text;
        }
    }
}

/// The next word of `text` and what follows it.
fn word(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    (&text[..end], &text[end..])
}

/// Consumes `keywords` (case-insensitive) from the front of `text` if all
/// are there.
fn keywords<'a>(text: &'a str, keywords: &[&str]) -> Option<&'a str> {
    keywords.iter().try_fold(text, |rest, keyword| {
        let (next, after) = word(rest);
        next.eq_ignore_ascii_case(keyword).then_some(after)
    })
}

/// Classifies one statement from [`split`].
pub fn classify(statement: &str) -> Result<Statement<'_>, String> {
    let text = strip_comments(statement);
    let create = keywords(text, &["CREATE"]);
    let (unique, after_index) = match create {
        Some(rest) => match keywords(rest, &["UNIQUE", "INDEX"]) {
            Some(after) => (true, Some(after)),
            None => (false, keywords(rest, &["INDEX"])),
        },
        None => (false, None),
    };
    if let Some(rest) = after_index {
        let rest = keywords(rest, &["CONCURRENTLY"]).unwrap_or(rest);
        let rest = keywords(rest, &["IF", "NOT", "EXISTS"]).unwrap_or(rest);
        let (name, rest) = word(rest);
        if name.eq_ignore_ascii_case("ON") || name.is_empty() {
            return Err(format!("an index without a name cannot be checked: {text}"));
        }
        let on = keywords(rest, &["ON"])
            .ok_or_else(|| format!("expected ON after the index name: {text}"))?
            .trim();
        return Ok(Statement::CreateIndex(IndexSpec { unique, name, on }));
    }
    if let Some(rest) = keywords(text, &["DROP", "INDEX"]) {
        let rest = keywords(rest, &["CONCURRENTLY"]).unwrap_or(rest);
        let rest = keywords(rest, &["IF", "EXISTS"]).unwrap_or(rest).trim();
        let (names, behaviour) = match rest.rsplit_once(char::is_whitespace) {
            Some((names, last)) if last.eq_ignore_ascii_case("RESTRICT") => (names, ""),
            Some((names, last)) if last.eq_ignore_ascii_case("CASCADE") => (names, last),
            _ => (rest, ""),
        };
        if !behaviour.is_empty() {
            // CASCADE would drop whatever depends on the index, and
            // cannot be done concurrently: say so instead.
            return Err(format!(
                "DROP INDEX … CASCADE is not supported in migrations: {text}"
            ));
        }
        let names: Vec<&str> = names.split(',').map(str::trim).collect();
        if names
            .iter()
            .any(|name| name.is_empty() || name.contains(char::is_whitespace))
        {
            return Err(format!("cannot read the index names of: {text}"));
        }
        return Ok(Statement::DropIndex(names));
    }
    Ok(Statement::Catalog(statement))
}

/// An index `migrate` ensures, its name and definition rendered for one
/// table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// The bare (unquoted) index name, as `pg_class` has it.
    pub name: String,
    /// `CREATE UNIQUE INDEX`.
    pub unique: bool,
    /// The rendered text after `ON`.
    pub on: String,
}

impl Index {
    /// The statement that builds it, in the table's schema; a no-op if an
    /// index of that name is already there.
    pub fn create_sql(&self, concurrently: bool) -> String {
        format!(
            "CREATE {}INDEX {}IF NOT EXISTS \"{}\" ON {}",
            if self.unique { "UNIQUE " } else { "" },
            if concurrently { "CONCURRENTLY " } else { "" },
            self.name,
            self.on
        )
    }
}

/// Every index the migrations leave on a table, and the indexes they drop
/// again, in migration order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct IndexPlan {
    /// Indexes that must exist and be valid.
    pub wanted: Vec<Index>,
    /// Bare names of indexes a later migration dropped and none re-created.
    pub dropped: Vec<String>,
}

impl IndexPlan {
    /// Follows the index statements of `migrations` (already split), with
    /// `render` filling the placeholders of names and definitions.
    pub fn of<'a>(
        migrations: impl IntoIterator<Item = Statement<'a>>,
        render: impl Fn(&str) -> String,
    ) -> Result<Self, String> {
        let mut plan = Self::default();
        for statement in migrations {
            match statement {
                Statement::CreateIndex(spec) => {
                    let name = bare_name(&render(spec.name))?;
                    plan.forget(&name);
                    plan.wanted.push(Index {
                        name,
                        unique: spec.unique,
                        on: render(spec.on),
                    });
                }
                Statement::DropIndex(names) => {
                    for name in names {
                        let name = bare_name(&render(name))?;
                        plan.forget(&name);
                        plan.dropped.push(name);
                    }
                }
                Statement::Catalog(_) => {}
            }
        }
        Ok(plan)
    }

    fn forget(&mut self, name: &str) {
        self.wanted.retain(|index| index.name != name);
        self.dropped.retain(|dropped| dropped != name);
    }
}

/// `"name"` or `name` as `pg_class.relname` stores it. Index names are
/// unqualified in migrations: an index always lives in its table's schema.
fn bare_name(name: &str) -> Result<String, String> {
    let bare = match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        Some(quoted) if !quoted.contains('"') => quoted.to_owned(),
        Some(_) => return Err(format!("index name {name} has a quote inside")),
        None if name.contains('.') => return Err(format!("index name {name} must not name a schema")),
        // Unquoted names are folded to lower case by PostgreSQL.
        None => name.to_ascii_lowercase(),
    };
    if bare.is_empty() || bare.len() > 63 {
        return Err(format!("index name {name} is not a PostgreSQL identifier"));
    }
    Ok(bare)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_semicolons_that_end_statements() {
        let sql = "-- a comment; with a semicolon\n\
                   CREATE TABLE t (a text DEFAULT 'x;y', \"b;c\" int);\n\
                   /* block; comment */\n\
                   CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$\n\
                   BEGIN PERFORM 1; RETURN NULL; END\n$$;\n\
                   DO $body$ BEGIN NULL; END $body$;\n\
                   -- only a comment at the end;\n";
        let statements = split(sql);
        assert_eq!(statements.len(), 3, "{statements:#?}");
        assert!(statements[0].ends_with("\"b;c\" int)"));
        assert!(statements[1].contains("RETURN NULL; END\n$$"));
        assert_eq!(statements[2], "DO $body$ BEGIN NULL; END $body$");
        assert_eq!(split("SELECT 'it''s; fine'"), ["SELECT 'it''s; fine'"]);
        assert_eq!(split("SELECT $1; SELECT 2"), ["SELECT $1", "SELECT 2"]);
    }

    #[test]
    fn index_statements_are_recognised() {
        let create = "-- why\nCREATE INDEX IF NOT EXISTS {pending_index}\n    ON {table} (created_at, id)\n    WHERE published_at IS NULL";
        assert_eq!(
            classify(create).unwrap(),
            Statement::CreateIndex(IndexSpec {
                unique: false,
                name: "{pending_index}",
                on: "{table} (created_at, id)\n    WHERE published_at IS NULL",
            })
        );
        assert_eq!(
            classify("create unique index concurrently x_idx on t (a)").unwrap(),
            Statement::CreateIndex(IndexSpec {
                unique: true,
                name: "x_idx",
                on: "t (a)"
            })
        );
        assert_eq!(
            classify("DROP INDEX IF EXISTS {pending_index}, old_idx RESTRICT").unwrap(),
            Statement::DropIndex(vec!["{pending_index}", "old_idx"])
        );
        assert!(classify("CREATE INDEX ON t (a)").is_err(), "unnamed");
        assert!(classify("DROP INDEX a_idx CASCADE").is_err());
        assert!(matches!(
            classify("ALTER TABLE {table} SET (fillfactor = 80)"),
            Ok(Statement::Catalog(_))
        ));
        assert!(matches!(
            classify("CREATE TABLE indexes (a int)"),
            Ok(Statement::Catalog(_))
        ));
    }

    fn plan_of(sql: &str) -> IndexPlan {
        let statements = split(sql).into_iter().map(|s| classify(s).unwrap());
        IndexPlan::of(statements, |text| text.replace("{t}", "\"tbl\"")).unwrap()
    }

    #[test]
    fn a_later_drop_removes_an_index_from_the_plan_and_a_create_brings_it_back() {
        let plan = plan_of(
            "CREATE INDEX IF NOT EXISTS \"a_idx\" ON {t} (a);
             CREATE INDEX IF NOT EXISTS \"b_idx\" ON {t} (b);
             DROP INDEX IF EXISTS \"a_idx\";
             CREATE INDEX IF NOT EXISTS \"c_idx\" ON {t} (c)",
        );
        let names: Vec<&str> = plan.wanted.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["b_idx", "c_idx"]);
        assert_eq!(plan.dropped, ["a_idx"]);
        assert_eq!(
            plan.wanted[0].create_sql(true),
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"b_idx\" ON \"tbl\" (b)"
        );
        let plan = plan_of("DROP INDEX x_idx; CREATE UNIQUE INDEX X_IDX ON {t} (x)");
        assert!(plan.dropped.is_empty());
        assert_eq!(
            plan.wanted[0].create_sql(false),
            "CREATE UNIQUE INDEX IF NOT EXISTS \"x_idx\" ON \"tbl\" (x)"
        );
    }

    #[test]
    fn index_names_are_bare_identifiers() {
        assert_eq!(bare_name("\"Mixed_Idx\"").unwrap(), "Mixed_Idx");
        assert_eq!(bare_name("Mixed_Idx").unwrap(), "mixed_idx");
        assert!(bare_name("app.some_idx").is_err());
        assert!(bare_name(&"n".repeat(64)).is_err());
    }
}
