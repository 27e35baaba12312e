//! The embedded SQLite backend: zero setup, one file, one process.
//!
//! SQLite allows one writer at a time; `BEGIN IMMEDIATE` takes the write lock
//! up front so concurrent writers queue (busy timeout) instead of failing on a
//! lock upgrade. New revisions are published in-process at commit.

use sqlx::Executor;
use sqlx::any::AnyPoolOptions;

use crate::StoreError;
use crate::sql::{Dialect, SqlStore};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

static DIALECT: Dialect = Dialect {
    begin_write: "BEGIN IMMEDIATE",
    // A deferred read transaction in WAL mode reads one snapshot throughout.
    begin_snapshot: "BEGIN",
    lock_head: "SELECT revision, compaction_floor FROM registry_head WHERE id = 1",
    put_server: "INSERT INTO mcp_servers (server_id, spec, revision, created_at_ms, updated_at_ms, updated_by, source) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (server_id) DO UPDATE SET spec = excluded.spec, revision = excluded.revision, \
         created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms, \
         updated_by = excluded.updated_by, source = excluded.source",
    insert_history: "INSERT INTO mcp_server_history (server_id, revision, kind, spec, at_ms, actor, source) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    select_server: "SELECT server_id, spec, revision, created_at_ms, updated_at_ms, updated_by, source \
         FROM mcp_servers WHERE server_id = $1",
    select_servers: "SELECT server_id, spec, revision, created_at_ms, updated_at_ms, updated_by, source \
         FROM mcp_servers ORDER BY server_id",
    select_history: "SELECT revision, kind, spec, at_ms, actor, source FROM mcp_server_history \
         WHERE server_id = $1 ORDER BY revision DESC",
    put_access: "INSERT INTO access_records (kind, name, spec, revision, created_at_ms, updated_at_ms, updated_by, source) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (kind, name) DO UPDATE SET spec = excluded.spec, revision = excluded.revision, \
         created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms, \
         updated_by = excluded.updated_by, source = excluded.source",
    insert_access_history: "INSERT INTO access_history (name, revision, change, spec, at_ms, actor, source, kind) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    json_as_text: "",
    upsert_function: None,
    queue_writers_in_process: true,
};

/// Pragmas of every connection: WAL for concurrent readers, full fsync so an
/// acknowledged write survives a crash, and a generous busy timeout for the
/// writer queue.
const PRAGMAS: &str =
    "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 30000;";

impl SqlStore {
    /// Opens (creating if missing) a SQLite database such as `sqlite://quiver.db`.
    /// `sqlite::memory:` gives a private in-memory store on one connection.
    pub async fn open_sqlite(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let in_memory = url.contains(":memory:");
        let url = if in_memory || url.contains("mode=") {
            url.to_owned()
        } else if url.contains('?') {
            format!("{url}&mode=rwc")
        } else {
            format!("{url}?mode=rwc")
        };
        let mut options = AnyPoolOptions::new().after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(PRAGMAS).await?;
                Ok(())
            })
        });
        if in_memory {
            // Every connection to :memory: is its own database: keep exactly one, forever.
            options = options
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        } else {
            options = options.max_connections(8);
        }
        let pool = options.connect(&url).await?;
        SqlStore::new(pool, &DIALECT, &MIGRATOR).await
    }
}
