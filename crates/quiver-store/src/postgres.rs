//! The PostgreSQL backend: production store, shared by registry replicas.
//!
//! A trigger on the change log sends `NOTIFY quiver_registry_changes` with the
//! new revision (migrations/postgres). Each store LISTENs and publishes the
//! revision locally, so a change committed through any replica wakes watchers
//! on every replica (R-STORE-7). Notifications sent while the listener is
//! reconnecting are lost, so after every (re)connect, and on a slow timer as a
//! safety net, the head is read from the database instead.

use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::StoreError;
use crate::sql::{Dialect, SqlStore, publish_head, read_head};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// The channel the change-log trigger notifies.
pub const CHANGE_CHANNEL: &str = "quiver_registry_changes";

/// How often the head is re-read even without notifications.
const HEAD_POLL_INTERVAL: Duration = Duration::from_secs(5);

static DIALECT: Dialect = Dialect {
    begin_write: "BEGIN ISOLATION LEVEL READ COMMITTED",
    begin_snapshot: "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
    lock_head: "SELECT revision, compaction_floor FROM registry_head WHERE id = 1 FOR UPDATE",
    put_server: "INSERT INTO mcp_servers (server_id, spec, revision, created_at_ms, updated_at_ms, updated_by, source) \
         VALUES ($1, $2::jsonb, $3, $4, $5, $6, $7) \
         ON CONFLICT (server_id) DO UPDATE SET spec = excluded.spec, revision = excluded.revision, \
         created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms, \
         updated_by = excluded.updated_by, source = excluded.source",
    insert_history: "INSERT INTO mcp_server_history (server_id, revision, kind, spec, at_ms, actor, source) \
         VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7)",
    select_server: "SELECT server_id, spec::text, revision, created_at_ms, updated_at_ms, updated_by, source \
         FROM mcp_servers WHERE server_id = $1",
    select_servers: "SELECT server_id, spec::text, revision, created_at_ms, updated_at_ms, updated_by, source \
         FROM mcp_servers ORDER BY server_id",
    select_history: "SELECT revision, kind, spec::text, at_ms, actor, source FROM mcp_server_history \
         WHERE server_id = $1 ORDER BY revision DESC",
    put_access: "INSERT INTO access_records (kind, name, spec, revision, created_at_ms, updated_at_ms, updated_by, source) \
         VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7, $8) \
         ON CONFLICT (kind, name) DO UPDATE SET spec = excluded.spec, revision = excluded.revision, \
         created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms, \
         updated_by = excluded.updated_by, source = excluded.source",
    insert_access_history: "INSERT INTO access_history (name, revision, change, spec, at_ms, actor, source, kind) \
         VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8)",
    json_as_text: "::text",
    upsert_function: Some(
        "SELECT outcome, revision, created_at_ms, updated_at_ms, updated_by, source \
         FROM quiver_upsert($1, $2::jsonb, $3, $4, $5, $6, $7)",
    ),
    queue_writers_in_process: false,
};

/// How long a request waits for a database connection. While PostgreSQL is
/// down, writes fail with this delay (UNAVAILABLE to the caller) instead of
/// sqlx's default of 30 s; with at most 16 connections and admin write
/// rates, a healthy pool never makes a request wait this long.
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl SqlStore {
    /// Connects to PostgreSQL (`postgres://…`), applies migrations and starts
    /// listening for changes made by other processes.
    pub async fn open_postgres(url: &str) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(url)
            .await?;
        let store = SqlStore::new(pool, &DIALECT, &MIGRATOR).await?;
        let mut listener = PgListener::connect(url).await?;
        listener.listen(CHANGE_CHANNEL).await?;
        let stop = CancellationToken::new();
        tokio::spawn(follow_changes(
            listener,
            store.pool().clone(),
            store.head_sender(),
            stop.clone(),
        ));
        Ok(store.with_tasks(stop.drop_guard()))
    }
}

async fn follow_changes(
    mut listener: PgListener,
    pool: sqlx::AnyPool,
    head_tx: watch::Sender<u64>,
    stop: CancellationToken,
) {
    let mut poll = tokio::time::interval(HEAD_POLL_INTERVAL);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            received = listener.try_recv() => match received {
                Ok(Some(notification)) => match notification.payload().parse::<u64>() {
                    Ok(revision) => publish_head(&head_tx, revision),
                    Err(_) => tracing::warn!(payload = notification.payload(), "ignoring malformed change notification"),
                },
                // Connection lost: it reconnects on the next call; what was
                // missed meanwhile is recovered by reading the head.
                Ok(None) => refresh_head(&pool, &head_tx).await,
                Err(err) => {
                    tracing::warn!(error = %err, "change listener failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    refresh_head(&pool, &head_tx).await;
                }
            },
            _ = poll.tick() => refresh_head(&pool, &head_tx).await,
        }
    }
}

async fn refresh_head(pool: &sqlx::AnyPool, head_tx: &watch::Sender<u64>) {
    match read_head(pool).await {
        Ok((revision, _)) => publish_head(head_tx, revision),
        Err(err) => tracing::warn!(error = %err, "reading registry head failed"),
    }
}
