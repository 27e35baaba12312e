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

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use quiver_model::access::{AccessKind, StoredAccess};
use quiver_model::{
    Change, ChangeKind, FieldError, HistoryEntry, McpServerSpec, ModelError, Source, StoredServer,
    validate,
};
use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};
use tokio::sync::{Mutex, MutexGuard, watch};
use tokio_util::sync::DropGuard;

use quiver_model::approval::{
    Approval, ApprovalBinding, ApprovalDecision, ApprovalState, UseOutcome,
};

use crate::{
    AccessDelete, AccessHistoryEntry, AccessOutcome, AccessPut, DecideOutcome, DeleteRequest,
    GrantKey, Head, HistoryPage, HistoryRow, NewApproval, OAuthAuthorizationRow,
    OAuthConnectionRow, OAuthTicketRow, OAuthTokens, RequestedApproval, SecretUpdate, Snapshot,
    Store, StoreError, UpsertOutcome, UpsertRequest,
};

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
const DELETE_SERVER: &str = "DELETE FROM mcp_servers WHERE server_id = $1";
const SELECT_CHANGES: &str = "SELECT revision, server_id, kind, at_ms, actor, access_kind \
     FROM mcp_server_changes WHERE revision > $1 ORDER BY revision LIMIT $2";
const COMPACT_CHANGES: &str = "DELETE FROM mcp_server_changes WHERE revision <= $1";

/// A store over one SQL database. Implements [`Store`] for both backends.
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

fn spec_from_json(text: &str) -> Result<McpServerSpec, StoreError> {
    serde_json::from_str(text).map_err(|err| StoreError::Corrupt(format!("stored record: {err}")))
}

fn spec_to_json(spec: &McpServerSpec) -> Result<String, StoreError> {
    serde_json::to_string(spec).map_err(|err| StoreError::Corrupt(format!("record to json: {err}")))
}

pub(crate) fn source_from(text: &str) -> Result<Source, StoreError> {
    text.parse()
        .map_err(|err: quiver_model::UnknownSource| StoreError::Corrupt(err.to_string()))
}

pub(crate) fn kind_from(text: &str) -> Result<ChangeKind, StoreError> {
    text.parse().map_err(StoreError::Corrupt)
}

/// Columns: server_id, spec, revision, created_at_ms, updated_at_ms, updated_by, source.
fn server_from_row(row: &AnyRow) -> Result<StoredServer, StoreError> {
    let spec = spec_from_json(&row.try_get::<String, _>(1)?)?;
    let server_id: String = row.try_get(0)?;
    if spec.server_id != server_id {
        return Err(StoreError::Corrupt(format!(
            "row {server_id:?} holds record {:?}",
            spec.server_id
        )));
    }
    Ok(StoredServer {
        spec,
        revision: to_u64(row.try_get(2)?)?,
        created_at: from_millis(row.try_get(3)?)?,
        updated_at: from_millis(row.try_get(4)?)?,
        updated_by: row.try_get(5)?,
        source: source_from(&row.try_get::<String, _>(6)?)?,
    })
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

/// Columns: revision, kind, spec (nullable), at_ms, actor, source.
fn history_from_row(row: &AnyRow) -> Result<HistoryEntry, StoreError> {
    history_from_columns(row, 0)
}

/// [`history_from_row`] of the six columns starting at `first`.
fn history_from_columns(row: &AnyRow, first: usize) -> Result<HistoryEntry, StoreError> {
    let spec: Option<String> = row.try_get(first + 2)?;
    Ok(HistoryEntry {
        revision: to_u64(row.try_get(first)?)?,
        kind: kind_from(&row.try_get::<String, _>(first + 1)?)?,
        spec: spec.as_deref().map(spec_from_json).transpose()?,
        at: from_millis(row.try_get(first + 3)?)?,
        actor: row.try_get(first + 4)?,
        source: source_from(&row.try_get::<String, _>(first + 5)?)?,
    })
}

/// The statement of [`Store::history_page`]: history rows with revision >
/// $1 (and server_id = $2 when `by_server`), each joined with the same
/// record's previous row, ordered as asked, limited by the last parameter.
/// Columns: server_id, then revision, kind, spec, at_ms, actor, source of the
/// row (1…6) and of the previous row (7…12, NULL when there is none).
fn history_page_sql(dialect: &Dialect, by_server: bool, newest_first: bool) -> String {
    let cast = dialect.json_as_text;
    let (server_filter, limit) = if by_server {
        (" AND server_id = $2", "$3")
    } else {
        ("", "$2")
    };
    let order = if newest_first { "DESC" } else { "ASC" };
    // The page is chosen first, so previous rows are looked up (through the
    // (server_id, revision) key) for the page's rows only.
    format!(
        "SELECT h.server_id, h.revision, h.kind, h.spec{cast}, h.at_ms, h.actor, h.source, \
         p.revision, p.kind, p.spec{cast}, p.at_ms, p.actor, p.source \
         FROM (SELECT server_id, revision, kind, spec, at_ms, actor, source \
         FROM mcp_server_history WHERE revision > $1{server_filter} \
         ORDER BY revision {order} LIMIT {limit}) h \
         LEFT JOIN mcp_server_history p ON p.server_id = h.server_id AND p.revision = \
         (SELECT MAX(q.revision) FROM mcp_server_history q \
         WHERE q.server_id = h.server_id AND q.revision < h.revision) \
         ORDER BY h.revision {order}"
    )
}

/// Columns as [`history_page_sql`] selects them.
fn history_row_from_row(row: &AnyRow) -> Result<HistoryRow, StoreError> {
    let previous_revision: Option<i64> = row.try_get(7)?;
    Ok(HistoryRow {
        server_id: row.try_get(0)?,
        entry: history_from_columns(row, 1)?,
        previous: previous_revision
            .map(|_| history_from_columns(row, 7))
            .transpose()?,
    })
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

    async fn current(
        &self,
        tx: &mut WriteTx,
        server_id: &str,
    ) -> Result<Option<StoredServer>, StoreError> {
        sqlx::query(self.dialect.select_server)
            .bind(server_id.to_owned())
            .fetch_optional(&mut **tx)
            .await?
            .map(|row| server_from_row(&row))
            .transpose()
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
    /// The checks and writes of one upsert inside a write transaction that
    /// holds the writer lock, at `head`. Writes nothing for a conflict or an
    /// identical record; the caller commits or rolls back.
    async fn upsert_in(
        &self,
        tx: &mut WriteTx,
        head: u64,
        request: UpsertRequest,
    ) -> Result<UpsertOutcome, StoreError> {
        let server_id = request.spec.server_id.clone();
        let spec_json = spec_to_json(&request.spec)?;
        let current = self.current(tx, &server_id).await?;
        check_expected(
            &server_id,
            request.expected_revision,
            current.as_ref().map(|c| c.revision),
        )?;
        if let Some(current) = &current
            && current.spec == request.spec
            && keeps_identical(&current.source, &request.source)
        {
            return Ok(UpsertOutcome::Unchanged(current.clone()));
        }
        let revision = head + 1;
        let now = Utc::now();
        let created_at = current.as_ref().map_or(now, |c| c.created_at);
        sqlx::query(self.dialect.put_server)
            .bind(server_id.clone())
            .bind(spec_json.clone())
            .bind(to_i64(revision)?)
            .bind(millis(created_at))
            .bind(millis(now))
            .bind(request.actor.clone())
            .bind(request.source.to_string())
            .execute(&mut **tx)
            .await?;
        let change = ChangeRow {
            revision,
            server_id: &server_id,
            access: None,
            kind: ChangeKind::Upsert,
            spec_json: Some(spec_json),
            at: now,
            actor: &request.actor,
            source: &request.source,
        };
        self.record_change(tx, change).await?;
        let stored = StoredServer {
            spec: request.spec,
            revision,
            // Stored with millisecond precision; report what a read returns.
            created_at: from_millis(millis(created_at))?,
            updated_at: from_millis(millis(now))?,
            updated_by: request.actor,
            source: request.source,
        };
        Ok(match current {
            None => UpsertOutcome::Created(stored),
            Some(_) => UpsertOutcome::Updated(stored),
        })
    }

    /// The checks and writes of one delete inside a write transaction that
    /// holds the writer lock, at `head`; returns the new revision. Writes
    /// nothing when refused; the caller commits or rolls back.
    async fn delete_in(
        &self,
        tx: &mut WriteTx,
        head: u64,
        request: &DeleteRequest,
    ) -> Result<u64, StoreError> {
        let current = self.current(tx, &request.server_id).await?;
        check_expected(
            &request.server_id,
            request.expected_revision,
            current.as_ref().map(|c| c.revision),
        )?;
        if current.is_none() {
            return Err(StoreError::NotFound(request.server_id.clone()));
        }
        let revision = head + 1;
        sqlx::query(DELETE_SERVER)
            .bind(request.server_id.clone())
            .execute(&mut **tx)
            .await?;
        let change = ChangeRow {
            revision,
            server_id: &request.server_id,
            access: None,
            kind: ChangeKind::Delete,
            spec_json: None,
            at: Utc::now(),
            actor: &request.actor,
            source: &request.source,
        };
        self.record_change(tx, change).await?;
        Ok(revision)
    }

    /// One upsert as one call of [`Dialect::upsert_function`]: on its own
    /// (autocommit) it is a whole write transaction in one round trip; inside
    /// a transaction it is one record of a batch.
    async fn call_upsert_function<'e, E>(
        &self,
        executor: E,
        function: &'static str,
        request: UpsertRequest,
    ) -> Result<UpsertOutcome, StoreError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Any>,
    {
        let spec_json = spec_to_json(&request.spec)?;
        // No revision lies beyond i64::MAX: a larger expectation conflicts.
        let expected = request
            .expected_revision
            .map(|e| i64::try_from(e).unwrap_or(i64::MAX));
        let row = sqlx::query(function)
            .bind(request.spec.server_id.clone())
            .bind(spec_json)
            .bind(expected)
            .bind(request.actor.clone())
            .bind(request.source.to_string())
            .bind(request.source.adopts_identical_record())
            .bind(millis(Utc::now()))
            .fetch_one(executor)
            .await?;
        let outcome: String = row.try_get(0)?;
        let revision = to_u64(row.try_get(1)?)?;
        if outcome == "conflict" {
            return Err(StoreError::Conflict {
                server_id: request.spec.server_id,
                expected: request.expected_revision.unwrap_or_default(),
                current: revision,
            });
        }
        // For "unchanged" the stored content equals the request's (equal
        // JSON documents deserialise to equal records).
        let stored = StoredServer {
            spec: request.spec,
            revision,
            created_at: from_millis(row.try_get(2)?)?,
            updated_at: from_millis(row.try_get(3)?)?,
            updated_by: row.try_get(4)?,
            source: source_from(&row.try_get::<String, _>(5)?)?,
        };
        match outcome.as_str() {
            "created" => Ok(UpsertOutcome::Created(stored)),
            "updated" => Ok(UpsertOutcome::Updated(stored)),
            "unchanged" => Ok(UpsertOutcome::Unchanged(stored)),
            other => Err(StoreError::Corrupt(format!(
                "upsert function returned outcome {other:?}"
            ))),
        }
    }

    /// The batch of [`Store::apply`], validated and free of duplicate ids.
    async fn apply_batch(
        &self,
        requests: Vec<UpsertRequest>,
    ) -> Result<(Vec<UpsertOutcome>, Option<u64>), StoreError> {
        let mut outcomes = Vec::with_capacity(requests.len());
        let mut last_revision = None;
        let in_record = |index: usize| {
            move |err: StoreError| StoreError::InRecord {
                index,
                source: Box::new(err),
            }
        };
        if let Some(function) = self.dialect.upsert_function {
            // The first record that changes takes the head lock inside the
            // function; it is held until the commit below, so the batch's
            // revisions are one contiguous range (see the migration).
            let mut tx = self.pool.begin_with(self.dialect.begin_write).await?;
            for (index, request) in requests.into_iter().enumerate() {
                let outcome = match self.call_upsert_function(&mut *tx, function, request).await {
                    Ok(outcome) => outcome,
                    Err(err) => {
                        tx.rollback().await?;
                        return Err(in_record(index)(err));
                    }
                };
                if !matches!(outcome, UpsertOutcome::Unchanged(_)) {
                    last_revision = Some(outcome.server().revision);
                }
                outcomes.push(outcome);
            }
            tx.commit().await?;
        } else {
            let (mut tx, (mut head, _), _turn) = self.begin_write().await?;
            for (index, request) in requests.into_iter().enumerate() {
                let outcome = match self.upsert_in(&mut tx, head, request).await {
                    Ok(outcome) => outcome,
                    Err(err) => {
                        // Roll back before the queue turn is released.
                        tx.rollback().await?;
                        return Err(in_record(index)(err));
                    }
                };
                if !matches!(outcome, UpsertOutcome::Unchanged(_)) {
                    head = outcome.server().revision;
                    last_revision = Some(head);
                }
                outcomes.push(outcome);
            }
            tx.commit().await?;
        }
        Ok((outcomes, last_revision))
    }
}

/// Refuses a batch that names one record twice, before anything is written.
fn check_unique_ids(requests: &[UpsertRequest]) -> Result<(), StoreError> {
    let mut seen = std::collections::HashMap::with_capacity(requests.len());
    for (index, request) in requests.iter().enumerate() {
        if let Some(first) = seen.insert(request.spec.server_id.as_str(), index) {
            return Err(StoreError::InRecord {
                index,
                source: Box::new(StoreError::Invalid(ModelError::Invalid(vec![
                    FieldError::new(
                        "server_id",
                        format!(
                            "{:?} appears twice in the batch (also record {first})",
                            request.spec.server_id
                        ),
                    ),
                ]))),
            });
        }
    }
    Ok(())
}

async fn read_head_with(
    tx: &mut WriteTx,
    statement: &'static str,
) -> Result<(u64, u64), StoreError> {
    let row = sqlx::query(statement).fetch_one(&mut **tx).await?;
    Ok((to_u64(row.try_get(0)?)?, to_u64(row.try_get(1)?)?))
}

#[async_trait]
impl Store for SqlStore {
    async fn list(&self) -> Result<Snapshot, StoreError> {
        let mut tx = self.pool.begin_with(self.dialect.begin_snapshot).await?;
        let (revision, _) = read_head(&mut *tx).await?;
        let rows = sqlx::query(self.dialect.select_servers)
            .fetch_all(&mut *tx)
            .await?;
        let access = crate::access::all_records(&mut *tx).await?;
        tx.commit().await?;
        let servers = rows.iter().map(server_from_row).collect::<Result<_, _>>()?;
        Ok(Snapshot {
            revision,
            servers,
            access,
        })
    }

    async fn get(&self, server_id: &str) -> Result<Option<StoredServer>, StoreError> {
        sqlx::query(self.dialect.select_server)
            .bind(server_id.to_owned())
            .fetch_optional(&self.pool)
            .await?
            .map(|row| server_from_row(&row))
            .transpose()
    }

    async fn upsert(&self, request: UpsertRequest) -> Result<UpsertOutcome, StoreError> {
        validate(&request.spec)?;
        if let Some(function) = self.dialect.upsert_function {
            // One statement, autocommit: the head stays locked only while the
            // function runs on the server and the commit flushes.
            let outcome = self
                .call_upsert_function(&self.pool, function, request)
                .await?;
            if !matches!(outcome, UpsertOutcome::Unchanged(_)) {
                publish_head(&self.head_tx, outcome.server().revision);
            }
            return Ok(outcome);
        }
        let (mut tx, (head, _), _turn) = self.begin_write().await?;
        let result = self.upsert_in(&mut tx, head, request).await;
        self.finish_write(tx, result, |outcome| match outcome {
            UpsertOutcome::Unchanged(_) => None,
            written => Some(written.server().revision),
        })
        .await
    }

    async fn apply(&self, requests: Vec<UpsertRequest>) -> Result<Vec<UpsertOutcome>, StoreError> {
        for (index, request) in requests.iter().enumerate() {
            validate(&request.spec).map_err(|err| StoreError::InRecord {
                index,
                source: Box::new(err.into()),
            })?;
        }
        check_unique_ids(&requests)?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let (outcomes, last_revision) = self.apply_batch(requests).await?;
        if let Some(revision) = last_revision {
            publish_head(&self.head_tx, revision);
        }
        Ok(outcomes)
    }

    async fn delete(&self, request: DeleteRequest) -> Result<u64, StoreError> {
        let (mut tx, (head, _), _turn) = self.begin_write().await?;
        let result = self.delete_in(&mut tx, head, &request).await;
        self.finish_write(tx, result, |revision| Some(*revision))
            .await
    }

    async fn history(&self, server_id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        let rows = sqlx::query(self.dialect.select_history)
            .bind(server_id.to_owned())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(history_from_row).collect()
    }

    async fn history_page(&self, page: HistoryPage<'_>) -> Result<Vec<HistoryRow>, StoreError> {
        let (after, server_id, limit, newest_first) = match page {
            HistoryPage::Newest { server_id, limit } => (0, server_id, limit, true),
            HistoryPage::After {
                after,
                server_id,
                limit,
            } => (after, server_id, limit, false),
        };
        let sql = history_page_sql(self.dialect, server_id.is_some(), newest_first);
        // Built from static fragments only; every value is a bound parameter.
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(cursor(after));
        if let Some(server_id) = server_id {
            query = query.bind(server_id.to_owned());
        }
        let rows = query.bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(history_row_from_row).collect()
    }

    async fn put_access(&self, request: AccessPut) -> Result<AccessOutcome, StoreError> {
        self.access_put(request).await
    }

    async fn delete_access(&self, request: AccessDelete) -> Result<u64, StoreError> {
        self.access_delete(request).await
    }

    async fn get_access(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Option<StoredAccess>, StoreError> {
        self.access_get(kind, name).await
    }

    async fn access_history(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Vec<AccessHistoryEntry>, StoreError> {
        self.access_history_of(kind, name).await
    }

    async fn access_at(&self, revision: u64) -> Result<Option<AccessHistoryEntry>, StoreError> {
        self.access_history_at(revision).await
    }

    async fn touch_api_keys(&self, used: &[(String, DateTime<Utc>)]) -> Result<(), StoreError> {
        self.access_touch_api_keys(used).await
    }

    async fn api_keys_last_used(
        &self,
    ) -> Result<std::collections::BTreeMap<String, DateTime<Utc>>, StoreError> {
        self.access_api_keys_last_used().await
    }

    async fn changes_since(&self, after: u64, limit: u32) -> Result<Vec<Change>, StoreError> {
        let rows = sqlx::query(SELECT_CHANGES)
            .bind(cursor(after))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(change_from_row).collect()
    }

    async fn head(&self) -> Result<Head, StoreError> {
        let (revision, compaction_floor) = read_head(&self.pool).await?;
        Ok(Head {
            revision,
            compaction_floor,
        })
    }

    async fn compact(&self, floor: u64) -> Result<Head, StoreError> {
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

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.head_tx.subscribe()
    }

    async fn create_approval(&self, request: NewApproval) -> Result<RequestedApproval, StoreError> {
        self.approvals_create(request).await
    }

    async fn purge_approvals(&self, before: DateTime<Utc>, limit: u32) -> Result<u64, StoreError> {
        self.approvals_purge(before, limit).await
    }

    async fn get_approval(&self, approval_id: &str) -> Result<Option<Approval>, StoreError> {
        self.approvals_get(approval_id).await
    }

    async fn list_approvals(
        &self,
        state: Option<ApprovalState>,
        limit: u32,
    ) -> Result<Vec<Approval>, StoreError> {
        self.approvals_list(state, limit).await
    }

    async fn expire_approvals(&self) -> Result<Vec<Approval>, StoreError> {
        self.approvals_expire(Utc::now()).await
    }

    async fn decide_approval(
        &self,
        approval_id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        note: Option<String>,
    ) -> Result<DecideOutcome, StoreError> {
        self.approvals_decide(approval_id, decision, decided_by, note)
            .await
    }

    async fn use_approval(
        &self,
        approval_id: &str,
        call: &ApprovalBinding,
        used_by: &str,
    ) -> Result<(UseOutcome, Option<Approval>), StoreError> {
        self.approvals_use(approval_id, call, used_by).await
    }

    async fn put_oauth_connection(
        &self,
        name: &str,
        config: String,
        secret: SecretUpdate,
    ) -> Result<OAuthConnectionRow, StoreError> {
        self.oauth_put_connection(name, config, secret).await
    }

    async fn get_oauth_connection(
        &self,
        name: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        self.oauth_get_connection(name).await
    }

    async fn list_oauth_connections(&self) -> Result<Vec<OAuthConnectionRow>, StoreError> {
        self.oauth_list_connections().await
    }

    async fn delete_oauth_connection(&self, name: &str) -> Result<bool, StoreError> {
        self.oauth_delete_connection(name).await
    }

    async fn store_oauth_tokens(
        &self,
        grant: GrantKey<'_>,
        expected_generation: u64,
        tokens: OAuthTokens,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        self.oauth_store_tokens(grant, expected_generation, tokens)
            .await
    }

    async fn set_oauth_needs_reconsent(
        &self,
        grant: GrantKey<'_>,
        expected_generation: u64,
        error: &str,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        self.oauth_set_needs_reconsent(grant, expected_generation, error)
            .await
    }

    async fn set_oauth_error(&self, grant: GrantKey<'_>, error: &str) -> Result<(), StoreError> {
        self.oauth_set_error(grant, error).await
    }

    async fn acquire_oauth_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.oauth_acquire_lease(grant, holder, ttl).await
    }

    async fn release_oauth_lease(
        &self,
        grant: GrantKey<'_>,
        holder: &str,
    ) -> Result<(), StoreError> {
        self.oauth_release_lease(grant, holder).await
    }

    async fn get_oauth_grant(
        &self,
        grant: GrantKey<'_>,
    ) -> Result<Option<OAuthConnectionRow>, StoreError> {
        self.oauth_get_grant(grant).await
    }

    async fn list_oauth_user_grants(
        &self,
        connection: Option<&str>,
        principal: Option<&str>,
    ) -> Result<Vec<OAuthConnectionRow>, StoreError> {
        self.oauth_list_user_grants(connection, principal).await
    }

    async fn delete_oauth_user_grant(
        &self,
        connection: &str,
        principal: &str,
    ) -> Result<bool, StoreError> {
        self.oauth_delete_user_grant(connection, principal).await
    }

    async fn create_oauth_ticket(&self, row: OAuthTicketRow) -> Result<(), StoreError> {
        self.oauth_create_ticket(row).await
    }

    async fn live_oauth_ticket(
        &self,
        connection: &str,
        principal: &str,
        live_at: DateTime<Utc>,
    ) -> Result<Option<OAuthTicketRow>, StoreError> {
        self.oauth_live_ticket(connection, principal, live_at).await
    }

    async fn take_oauth_ticket(
        &self,
        ticket_sha256: &str,
    ) -> Result<Option<OAuthTicketRow>, StoreError> {
        self.oauth_take_ticket(ticket_sha256).await
    }

    async fn create_oauth_authorization(
        &self,
        row: OAuthAuthorizationRow,
    ) -> Result<(), StoreError> {
        self.oauth_create_authorization(row).await
    }

    async fn get_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError> {
        self.oauth_get_authorization(state).await
    }

    async fn take_oauth_authorization(
        &self,
        state: &str,
    ) -> Result<Option<OAuthAuthorizationRow>, StoreError> {
        self.oauth_take_authorization(state).await
    }

    async fn revoke_gateway_session(
        &self,
        session_sha256: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.sessions_revoke(session_sha256, expires_at).await
    }

    async fn gateway_session_revocation(
        &self,
        session_sha256: &str,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.sessions_revocation(session_sha256).await
    }

    async fn lease_calls(
        &self,
        key: &str,
        limit: u32,
        per_s: u32,
        want: u32,
    ) -> Result<crate::CallsLease, StoreError> {
        self.usage_lease(key, limit, per_s, want).await
    }

    async fn give_back_calls(
        &self,
        key: &str,
        window_start_ms: i64,
        calls: u32,
    ) -> Result<(), StoreError> {
        self.usage_give_back(key, window_start_ms, calls).await
    }

    async fn record_usage(&self, batch: &crate::UsageBatch) -> Result<bool, StoreError> {
        self.usage_record(batch).await
    }

    async fn usage(
        &self,
        group: quiver_model::usage::UsageGroup,
        since_ms: i64,
        until_ms: i64,
        step_ms: Option<i64>,
    ) -> Result<(Vec<quiver_model::usage::UsageTotal>, bool), StoreError> {
        self.usage_totals(group, since_ms, until_ms, step_ms).await
    }

    async fn prune_usage(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.usage_prune(before_ms).await
    }
}
