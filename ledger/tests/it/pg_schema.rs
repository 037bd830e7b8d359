//! `ledger/src/store/pg/schema.sql` against the migrations: one fresh database migrated as
//! the store's open migrates it, another loaded from `schema.sql`, and their catalogs
//! compared item by item (tables, columns, constraints, indexes, sequences, domains,
//! triggers and every function's definition), so the file and the migrations cannot
//! drift apart.
//!
//! PostgreSQL is found at `IDEM_TEST_PG_URL`, as for the conformance suite; without it the
//! tests say SKIPPED, or fail when `IDEM_REQUIRE_SERVICES=1` (see `ledger::testing`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ledger::testing::PgTestDb;
use ledger::*;

/// The schema as one file.
const SCHEMA_SQL: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/store/pg/schema.sql"
));
/// The store's schema (`PgConfig`'s default), where both databases keep theirs.
const SCHEMA: &str = "idem";

/// The functions the store calls: the comparison must see them, or it compares nothing.
const CALLED: [&str; 3] = ["idem_claim_group", "idem_apply_group", "idem_apply_one"];

/// One database's schema: each item (`"function idem.f(text)"`, `"column accounts.balance"`,
/// ...) with what defines it.
type Catalog = BTreeMap<String, String>;

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// A fresh database migrated by `PgStore::open`, which runs every migration in order.
async fn migrated(test: &str) -> Option<PgTestDb> {
    let db = PgTestDb::create(test, "idem_schema").await?;
    let rules = Rules {
        retention: Duration::from_secs(24 * 3600),
        lease: Duration::from_secs(10),
        clock: Arc::new(SystemClock),
    };
    let (store, report) = PgStore::open(&db.url, rules, PgConfig::default())
        .await
        .unwrap();
    assert!(report.fresh, "the database was not fresh");
    store.shutdown().await;
    Some(db)
}

/// A fresh database with `sql` (the text of `schema.sql`, or a variant) loaded into the
/// store's schema, on the search_path as the migrations are run.
async fn loaded(test: &str, sql: &str) -> Option<PgTestDb> {
    let db = PgTestDb::create(test, "idem_schema").await?;
    connect(&db.url)
        .await
        .batch_execute(&format!(
            "BEGIN; CREATE SCHEMA {SCHEMA}; SET LOCAL search_path = {SCHEMA};\n{sql}\n; COMMIT"
        ))
        .await
        .unwrap_or_else(|e| panic!("schema.sql does not load: {e:?}"));
    Some(db)
}

/// Each query answers (item, definition) rows, all text; `$1` is the schema. The
/// migrator's own table (`schema_version`, made by `open.rs`) is left out.
const QUERIES: &[(&str, &str)] = &[
    (
        "relation",
        "SELECT c.relname, c.relkind::text || ' ' || c.relpersistence::text FROM pg_class c \
         WHERE c.relnamespace = $1::text::regnamespace \
           AND c.relname NOT IN ('schema_version', 'schema_version_pkey')",
    ),
    (
        "column",
        "SELECT table_name || '.' || column_name, concat_ws(' | ', \
             'type ' || data_type, 'domain ' || domain_name, 'udt ' || udt_name, \
             'length ' || character_maximum_length, 'precision ' || numeric_precision, \
             'scale ' || numeric_scale, 'time precision ' || datetime_precision, \
             'collation ' || collation_name, 'nullable ' || is_nullable, \
             'default ' || column_default, 'identity ' || is_identity, \
             'identity generation ' || identity_generation, \
             'identity start ' || identity_start, 'identity step ' || identity_increment, \
             'generated ' || is_generated, 'generation ' || generation_expression) \
         FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name <> 'schema_version'",
    ),
    (
        // The columns' order (without their numbers: a column dropped and added again
        // keeps a gap in them).
        "column order of",
        "SELECT c.relname, string_agg(a.attname, ', ' ORDER BY a.attnum) \
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
         WHERE c.relnamespace = $1::text::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
           AND c.relname <> 'schema_version' AND a.attnum > 0 AND NOT a.attisdropped \
         GROUP BY c.relname",
    ),
    (
        // What information_schema leaves out: the collation even when it is the default,
        // and a column's stored expression as PostgreSQL keeps it.
        "column (catalog)",
        "SELECT c.relname || '.' || a.attname, concat_ws(' | ', \
             format_type(a.atttypid, a.atttypmod), 'collation ' || co.collname, \
             'not null ' || a.attnotnull, 'identity ' || nullif(a.attidentity::text, ''), \
             'generated ' || nullif(a.attgenerated::text, ''), \
             'expression ' || pg_get_expr(d.adbin, d.adrelid)) \
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
         LEFT JOIN pg_collation co ON co.oid = a.attcollation \
         LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
         WHERE c.relnamespace = $1::text::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
           AND c.relname <> 'schema_version' AND a.attnum > 0 AND NOT a.attisdropped",
    ),
    (
        "constraint",
        "SELECT coalesce(c.conrelid::regclass::text, c.contypid::regtype::text) || ' ' \
             || c.conname, \
             concat_ws(' | ', pg_get_constraintdef(c.oid), \
                 'deferrable ' || c.condeferrable, 'deferred ' || c.condeferred, \
                 'validated ' || c.convalidated) \
         FROM pg_constraint c \
         WHERE c.connamespace = $1::text::regnamespace AND c.conname <> 'schema_version_pkey'",
    ),
    (
        "index",
        "SELECT indexname, indexdef FROM pg_indexes \
         WHERE schemaname = $1 AND tablename <> 'schema_version'",
    ),
    (
        "sequence",
        "SELECT sequencename, concat_ws(' | ', data_type, 'start ' || start_value, \
             'min ' || min_value, 'max ' || max_value, 'step ' || increment_by, \
             'cycle ' || cycle, 'cache ' || cache_size) \
         FROM pg_sequences WHERE schemaname = $1",
    ),
    (
        "domain",
        "SELECT t.typname, concat_ws(' | ', format_type(t.typbasetype, t.typtypmod), \
             'not null ' || t.typnotnull, 'default ' || t.typdefault, \
             'collation ' || co.collname) \
         FROM pg_type t LEFT JOIN pg_collation co ON co.oid = t.typcollation \
         WHERE t.typnamespace = $1::text::regnamespace AND t.typtype = 'd'",
    ),
    (
        "trigger",
        "SELECT t.tgrelid::regclass::text || ' ' || t.tgname, pg_get_triggerdef(t.oid) \
         FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
         WHERE c.relnamespace = $1::text::regnamespace AND NOT t.tgisinternal",
    ),
    (
        // Name, arguments, result, language, volatility, settings and body.
        "function",
        "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p \
         WHERE p.pronamespace = $1::text::regnamespace",
    ),
];

/// The schema of the database at `url`.
async fn catalog(url: &str) -> Catalog {
    let client = connect(url).await;
    let mut out = Catalog::new();
    for (kind, query) in QUERIES {
        for row in client.query(*query, &[&SCHEMA]).await.unwrap() {
            let item: String = row.get(0);
            let definition: Option<String> = row.get(1);
            let previous = out.insert(format!("{kind} {item}"), definition.unwrap_or_default());
            assert!(previous.is_none(), "{kind} {item} is listed twice");
        }
    }
    out
}

/// What `schema.sql`'s catalog (`file`) says otherwise than the migrations' (`migrated`),
/// one line per item, naming it; for a definition of several lines, its first line that
/// differs.
fn differences(migrated: &Catalog, file: &Catalog) -> Vec<String> {
    let mut out = Vec::new();
    for (item, def) in migrated {
        match file.get(item) {
            None => out.push(format!("{item}: made by the migrations, not in schema.sql")),
            Some(other) if other != def => {
                let (m, f): (Vec<&str>, Vec<&str>) =
                    (def.lines().collect(), other.lines().collect());
                let line = (0..m.len().max(f.len()))
                    .find(|&i| m.get(i) != f.get(i))
                    .unwrap_or(0);
                out.push(format!(
                    "{item}: differs at line {}:\n    migrations: {}\n    schema.sql: {}",
                    line + 1,
                    m.get(line).unwrap_or(&"(nothing)"),
                    f.get(line).unwrap_or(&"(nothing)"),
                ));
            }
            Some(_) => {}
        }
    }
    for item in file.keys().filter(|item| !migrated.contains_key(*item)) {
        out.push(format!("{item}: in schema.sql, not made by the migrations"));
    }
    out
}

fn functions(catalog: &Catalog) -> Vec<&str> {
    catalog
        .keys()
        .filter_map(|item| item.strip_prefix("function "))
        .collect()
}

/// A database migrated as the store's open does and one loaded from `schema.sql` have the
/// same tables, columns (names, order, types, nullability, defaults, generated
/// expressions, collations), constraints, indexes, sequences, domains, triggers and
/// functions (`pg_get_functiondef`: arguments, result, settings, body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_sql_is_the_schema_the_migrations_make() {
    let test = "schema_sql_is_the_schema_the_migrations_make";
    let Some(by_migrations) = migrated(test).await else {
        return;
    };
    let Some(from_file) = loaded(test, SCHEMA_SQL).await else {
        return;
    };
    let (m, f) = (
        catalog(&by_migrations.url).await,
        catalog(&from_file.url).await,
    );
    for (kind, _) in QUERIES.iter().filter(|(kind, _)| *kind != "trigger") {
        assert!(
            m.keys().any(|item| item.starts_with(&format!("{kind} "))),
            "the migrations make no {kind}: the comparison would see nothing"
        );
    }
    for called in CALLED {
        assert!(
            functions(&m)
                .iter()
                .any(|sig| sig.starts_with(&format!("{SCHEMA}.{called}("))),
            "the migrations make no {called}: {:?}",
            functions(&m)
        );
    }
    let found = differences(&m, &f);
    assert!(
        found.is_empty(),
        "schema.sql and the migrations disagree on {} item(s):\n{}",
        found.len(),
        found.join("\n")
    );
    by_migrations.drop_now().await;
    from_file.drop_now().await;
}

/// The comparison sees a change inside a function's body, and names that function alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_function_body_is_named() {
    let test = "a_changed_function_body_is_named";
    let raise = "RAISE EXCEPTION 'a new account''s first change is not its balance'";
    let in_one = SCHEMA_SQL
        .find("CREATE FUNCTION idem_apply_one(")
        .and_then(|start| SCHEMA_SQL[start..].find(raise).map(|at| start + at))
        .expect("idem_apply_one raises on a new account's first change");
    let changed = format!(
        "{}RAISE EXCEPTION 'a changed message'{}",
        &SCHEMA_SQL[..in_one],
        &SCHEMA_SQL[in_one + raise.len()..]
    );
    let Some(original) = loaded(test, SCHEMA_SQL).await else {
        return;
    };
    let Some(variant) = loaded(test, &changed).await else {
        return;
    };
    let found = differences(&catalog(&original.url).await, &catalog(&variant.url).await);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(&format!("function {SCHEMA}.idem_apply_one(")),
        "{found:#?}"
    );
    assert!(found[0].contains("a changed message"), "{found:#?}");
    original.drop_now().await;
    variant.drop_now().await;
}
