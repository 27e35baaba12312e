//! The revision algorithm, written once over `sqlx::AnyPool` and run on both
//! backends with their own SQL dialect ([`Dialect`]).
//!
//! Writers serialise on the single `registry_head` row (PostgreSQL: `FOR
//! UPDATE`; SQLite: `BEGIN IMMEDIATE`), so the revision they take is exactly
//! head + 1 and commits happen in revision order: a reader that sees revision
//! N committed also sees every revision below N.
//!
//! On PostgreSQL an upsert is one call of a server-side function
//! ([`Dialect::upsert_function`], migrations/postgres/0003_upsert_function.sql)
//! running the same steps, so the head row stays locked for the server-side
//! work and the commit only, not for six client round trips; the argument for
//! gap-free, in-order revisions is the same and is spelled out there.
//!
//! This module is the core every record kind shares: the connection and its
//! dialect, the head row, write transactions, the change log and the row
//! conversions; the server records' own statements are in `servers`.

use chrono::{DateTime, TimeZone, Utc};
use quiver_model::access::AccessKind;
use quiver_model::{Change, ChangeKind, Source};
use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};
use tokio::sync::{Mutex, MutexGuard, watch};
use tokio_util::sync::DropGuard;

use crate::error::StoreError;

/// The statements that differ between PostgreSQL and SQLite.
pub(crate) struct Dialect {
    /// Opens a write transaction.
    pub begin_write: &'static str,
    /// Opens a read-only transaction that sees one consistent snapshot.
    pub begin_snapshot: &'static str,
    /// Reads the head row, taking the writer lock where the engine needs it.
    pub lock_head: &'static str,
    /// Inserts or replaces a record: ($1 id, $2 spec json, $3 revision, $4 created, $5 updated, $6 by, $7 source).
    pub put_server: &'static str,
    /// Appends a history row: ($1 id, $2 revision, $3 kind, $4 spec json or NULL, $5 at, $6 actor, $7 source).
    pub insert_history: &'static str,
    /// Selects one record by id ($1), same columns as `select_servers`.
    pub select_server: &'static str,
    /// Selects every record ordered by id.
    pub select_servers: &'static str,
    /// Selects the history of one record ($1), newest first.
    pub select_history: &'static str,
    /// Inserts or replaces an access record: ($1 kind, $2 name, $3 spec json,
    /// $4 revision, $5 created, $6 updated, $7 by, $8 source).
    pub put_access: &'static str,
    /// Appends an access history row, with the parameters of
    /// `insert_history` (the record's name as $1) and $8 its kind.
    pub insert_access_history: &'static str,
    /// Appended to a JSON column to read it as text (`::text` on PostgreSQL).
    pub json_as_text: &'static str,
    /// A server-side function doing a whole upsert in one statement (see
    /// migrations/postgres/0003_upsert_function.sql), called with ($1 id,
    /// $2 spec json, $3 expected revision or NULL, $4 actor, $5 source,
    /// $6 adopts identical, $7 now ms) and returning (outcome, revision,
    /// created_at_ms, updated_at_ms, updated_by, source). `None`: the engine
    /// runs the statements of [`SqlStore::upsert_in`] in a write transaction.
    pub upsert_function: Option<&'static str>,
    /// Queue writers on an in-process lock before they open a transaction.
    /// For an engine owned by one process (SQLite) this makes waiting fair
    /// and ordered instead of the engine's sleep-and-retry busy handler.
    pub queue_writers_in_process: bool,
}

const SELECT_HEAD: &str = "SELECT revision, compaction_floor FROM registry_head WHERE id = 1";
const SET_HEAD_REVISION: &str = "UPDATE registry_head SET revision = $1 WHERE id = 1";
const SET_COMPACTION_FLOOR: &str = "UPDATE registry_head SET compaction_floor = $1 WHERE id = 1";
const INSERT_CHANGE: &str = "INSERT INTO mcp_server_changes (revision, server_id, kind, at_ms, actor, access_kind) \
     VALUES ($1, $2, $3, $4, $5, $6)";
const SELECT_CHANGES: &str = "SELECT revision, server_id, kind, at_ms, actor, access_kind \
     FROM mcp_server_changes WHERE revision > $1 ORDER BY revision LIMIT $2";
const COMPACT_CHANGES: &str = "DELETE FROM mcp_server_changes WHERE revision <= $1";

/// The global revision and the change-log compaction floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Head {
    /// Last committed revision (0 for an empty store).
    pub revision: u64,
    /// Change-log rows at or below this revision are gone; watching from an
    /// older revision is impossible.
    pub compaction_floor: u64,
}

/// A store over one SQL database. Implements [`Store`](crate::Store) for both backends.
pub struct SqlStore {
    pool: AnyPool,
    dialect: &'static Dialect,
    head_tx: watch::Sender<u64>,
    /// Present when [`Dialect::queue_writers_in_process`] is set.
    writer_queue: Option<Mutex<()>>,
    /// Stops backend tasks (the PostgreSQL listener) when the store is dropped.
    _tasks: Option<DropGuard>,
}

impl SqlStore {
    pub(crate) async fn new(
        pool: AnyPool,
        dialect: &'static Dialect,
        migrator: &sqlx::migrate::Migrator,
    ) -> Result<Self, StoreError> {
        migrator.run(&pool).await?;
        let (revision, _) = read_head(&pool).await?;
        let (head_tx, _) = watch::channel(revision);
        Ok(SqlStore {
            pool,
            dialect,
            head_tx,
            writer_queue: dialect.queue_writers_in_process.then(|| Mutex::new(())),
            _tasks: None,
        })
    }

    pub(crate) fn with_tasks(mut self, guard: DropGuard) -> Self {
        self._tasks = Some(guard);
        self
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub(crate) fn dialect(&self) -> &'static Dialect {
        self.dialect
    }

    /// Publishes a revision known to be committed (never moves backwards).
    pub(crate) fn head_sender(&self) -> watch::Sender<u64> {
        self.head_tx.clone()
    }

    /// Publishes `revision`, committed by this store.
    pub(crate) fn publish_revision(&self, revision: u64) {
        publish_head(&self.head_tx, revision);
    }
}

pub(crate) fn publish_head(head_tx: &watch::Sender<u64>, revision: u64) {
    head_tx.send_if_modified(|current| {
        let newer = revision > *current;
        if newer {
            *current = revision;
        }
        newer
    });
}

pub(crate) async fn read_head<'e, E>(executor: E) -> Result<(u64, u64), StoreError>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    let row = sqlx::query(SELECT_HEAD).fetch_one(executor).await?;
    Ok((
        to_u64(row.try_get::<i64, _>(0)?)?,
        to_u64(row.try_get::<i64, _>(1)?)?,
    ))
}

pub(crate) fn to_u64(value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("negative revision {value}")))
}

pub(crate) fn to_i64(value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::Corrupt(format!("revision {value} out of range")))
}

/// A caller's "after revision N" as a bound parameter. No revision lies
/// beyond [`crate::MAX_REVISION`], so a larger cursor asks for exactly what
/// that one asks for (nothing): it is input, not corrupt data.
pub(crate) fn cursor(after: u64) -> i64 {
    i64::try_from(after).unwrap_or(i64::MAX)
}

pub(crate) fn millis(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

pub(crate) fn from_millis(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {ms} out of range")))
}

pub(crate) fn source_from(text: &str) -> Result<Source, StoreError> {
    text.parse()
        .map_err(|err: quiver_model::UnknownSource| StoreError::Corrupt(err.to_string()))
}

pub(crate) fn kind_from(text: &str) -> Result<ChangeKind, StoreError> {
    text.parse().map_err(StoreError::Corrupt)
}

/// Columns as [`SELECT_CHANGES`] selects them.
fn change_from_row(row: &AnyRow) -> Result<Change, StoreError> {
    let access: Option<String> = row.try_get(5)?;
    Ok(Change {
        revision: to_u64(row.try_get(0)?)?,
        server_id: row.try_get(1)?,
        kind: kind_from(&row.try_get::<String, _>(2)?)?,
        at: from_millis(row.try_get(3)?)?,
        actor: row.try_get(4)?,
        access: access.as_deref().map(access_kind_from).transpose()?,
    })
}

pub(crate) fn access_kind_from(text: &str) -> Result<AccessKind, StoreError> {
    AccessKind::parse(text)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown access record kind {text:?}")))
}

/// Refuses a write whose `expected` revision is not the record's `current`
/// one (`None`: it does not exist); `record` names it in the conflict.
pub(crate) fn check_expected(
    record: &str,
    expected: Option<u64>,
    current: Option<u64>,
) -> Result<(), StoreError> {
    let current_revision = current.unwrap_or(0);
    match expected {
        Some(expected) if expected != current_revision => Err(StoreError::Conflict {
            server_id: record.to_owned(),
            expected,
            current: current_revision,
        }),
        _ => Ok(()),
    }
}

/// Whether a write of content identical to the stored content is a no-op:
/// unless its source adopts identical records and differs from the stored
/// one (a record moved between files changes owner).
pub(crate) fn keeps_identical(stored: &Source, incoming: &Source) -> bool {
    stored == incoming || !incoming.adopts_identical_record()
}

pub(crate) type WriteTx = sqlx::Transaction<'static, sqlx::Any>;

/// The change-log and history rows of one revision.
pub(crate) struct ChangeRow<'a> {
    pub revision: u64,
    /// The server id, or the access record's name.
    pub server_id: &'a str,
    /// `Some` for an access record: its kind (the change-log column
    /// `access_kind`, and the history goes to `access_history`).
    pub access: Option<AccessKind>,
    pub kind: ChangeKind,
    /// The record as of this revision; `None` for deletes.
    pub spec_json: Option<String>,
    pub at: DateTime<Utc>,
    pub actor: &'a str,
    pub source: &'a Source,
}

impl SqlStore {
    /// Opens a write transaction holding the writer lock; returns it with
    /// the head revision and compaction floor. The queue turn (if any) must
    /// be held until the transaction ends.
    pub(crate) async fn begin_write(
        &self,
    ) -> Result<(WriteTx, (u64, u64), Option<MutexGuard<'_, ()>>), StoreError> {
        let (mut tx, turn) = self.begin_write_tx().await?;
        let head = read_head_with(&mut tx, self.dialect.lock_head).await?;
        Ok((tx, head, turn))
    }

    /// Opens a write transaction ([`Dialect::begin_write`]) after taking a
    /// turn in the in-process writer queue (if any), without touching the
    /// registry head: for tables outside the revision log. The queue turn
    /// must be held until the transaction ends.
    pub(crate) async fn begin_write_tx(
        &self,
    ) -> Result<(WriteTx, Option<MutexGuard<'_, ()>>), StoreError> {
        let turn = match &self.writer_queue {
            Some(queue) => Some(queue.lock().await),
            None => None,
        };
        let tx = self.pool.begin_with(self.dialect.begin_write).await?;
        Ok((tx, turn))
    }

    /// Appends the change-log and history rows of a change and moves head.
    pub(crate) async fn record_change(
        &self,
        tx: &mut WriteTx,
        change: ChangeRow<'_>,
    ) -> Result<(), StoreError> {
        let ChangeRow {
            revision,
            server_id,
            access,
            kind,
            spec_json,
            at,
            actor,
            source,
        } = change;
        let rev = to_i64(revision)?;
        sqlx::query(SET_HEAD_REVISION)
            .bind(rev)
            .execute(&mut **tx)
            .await?;
        sqlx::query(INSERT_CHANGE)
            .bind(rev)
            .bind(server_id.to_owned())
            .bind(kind.as_str())
            .bind(millis(at))
            .bind(actor.to_owned())
            .bind(access.map(AccessKind::as_str))
            .execute(&mut **tx)
            .await?;
        let insert_history = match access {
            None => self.dialect.insert_history,
            Some(_) => self.dialect.insert_access_history,
        };
        let mut history = sqlx::query(insert_history)
            .bind(server_id.to_owned())
            .bind(rev)
            .bind(kind.as_str())
            .bind(spec_json)
            .bind(millis(at))
            .bind(actor.to_owned())
            .bind(source.to_string());
        if let Some(access) = access {
            history = history.bind(access.as_str());
        }
        history.execute(&mut **tx).await?;
        Ok(())
    }

    async fn commit(&self, tx: WriteTx, revision: u64) -> Result<(), StoreError> {
        tx.commit().await?;
        publish_head(&self.head_tx, revision);
        Ok(())
    }

    /// Ends a write transaction with the `result` of its work: commits and
    /// publishes the revision `written` finds in it, or rolls back when it
    /// finds none (nothing was written) or the work failed. The caller
    /// still holds its queue turn, so the rollback happens before the turn
    /// is released, not lazily on drop.
    pub(crate) async fn finish_write<T>(
        &self,
        tx: WriteTx,
        result: Result<T, StoreError>,
        written: impl FnOnce(&T) -> Option<u64>,
    ) -> Result<T, StoreError> {
        let value = match result {
            Ok(value) => value,
            Err(err) => {
                tx.rollback().await?;
                return Err(err);
            }
        };
        match written(&value) {
            Some(revision) => self.commit(tx, revision).await?,
            None => tx.rollback().await?,
        }
        Ok(value)
    }
}

impl SqlStore {
    /// Change-log rows with revision > `after`, in order, at most `limit`.
    pub(crate) async fn changelog_since(
        &self,
        after: u64,
        limit: u32,
    ) -> Result<Vec<Change>, StoreError> {
        let rows = sqlx::query(SELECT_CHANGES)
            .bind(cursor(after))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(change_from_row).collect()
    }

    /// Current head and compaction floor.
    pub(crate) async fn changelog_head(&self) -> Result<Head, StoreError> {
        let (revision, compaction_floor) = read_head(&self.pool).await?;
        Ok(Head {
            revision,
            compaction_floor,
        })
    }

    /// Drops change-log rows at or below `floor` (clamped to head).
    pub(crate) async fn changelog_compact(&self, floor: u64) -> Result<Head, StoreError> {
        let (mut tx, (revision, current_floor), _turn) = self.begin_write().await?;
        let new_floor = floor.min(revision).max(current_floor);
        if new_floor > current_floor {
            sqlx::query(COMPACT_CHANGES)
                .bind(to_i64(new_floor)?)
                .execute(&mut *tx)
                .await?;
            sqlx::query(SET_COMPACTION_FLOOR)
                .bind(to_i64(new_floor)?)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Head {
            revision,
            compaction_floor: new_floor,
        })
    }
}

async fn read_head_with(
    tx: &mut WriteTx,
    statement: &'static str,
) -> Result<(u64, u64), StoreError> {
    let row = sqlx::query(statement).fetch_one(&mut **tx).await?;
    Ok((to_u64(row.try_get(0)?)?, to_u64(row.try_get(1)?)?))
}
