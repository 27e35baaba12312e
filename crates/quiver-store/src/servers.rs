//! MCP server records: the requests and answers of their revisioned writes
//! and reads, and the statements of the revision algorithm for them (upsert,
//! batch apply, delete, history), on the core of `sql`.

use chrono::Utc;
use quiver_model::access::StoredAccess;
use quiver_model::{
    ChangeKind, FieldError, HistoryEntry, McpServerSpec, ModelError, Source, StoredServer, validate,
};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::error::StoreError;
use crate::sql::{
    ChangeRow, Dialect, SqlStore, WriteTx, check_expected, cursor, from_millis, keeps_identical,
    kind_from, millis, read_head, source_from, to_i64, to_u64,
};

const DELETE_SERVER: &str = "DELETE FROM mcp_servers WHERE server_id = $1";

/// A consistent view: the records exactly as of `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Revision the snapshot was taken at.
    pub revision: u64,
    /// Every stored record, ordered by `server_id`.
    pub servers: Vec<StoredServer>,
    /// Every access record, ordered by kind (in [`AccessKind`](quiver_model::access::AccessKind)'s order:
    /// policies, keys, providers) then name.
    pub access: Vec<StoredAccess>,
}

/// A create-or-replace.
#[derive(Debug, Clone)]
pub struct UpsertRequest {
    /// The new content.
    pub spec: McpServerSpec,
    /// `Some(0)`: must not exist; `Some(n)`: current revision must be `n`.
    pub expected_revision: Option<u64>,
    /// Who writes (audit).
    pub actor: String,
    /// Where the content comes from.
    pub source: Source,
}

/// A delete.
#[derive(Debug, Clone)]
pub struct DeleteRequest {
    /// The record to delete.
    pub server_id: String,
    /// `Some(n)`: current revision must be `n`.
    pub expected_revision: Option<u64>,
    /// Who deletes (audit).
    pub actor: String,
    /// Where the delete comes from.
    pub source: Source,
}

/// What an upsert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpsertOutcome {
    /// The record did not exist.
    Created(StoredServer),
    /// The record changed (new revision).
    Updated(StoredServer),
    /// Identical content: nothing written, the stored record is returned.
    Unchanged(StoredServer),
}

impl UpsertOutcome {
    /// What happened, as APIs name it: `created`, `updated`, `unchanged`.
    pub fn as_str(&self) -> &'static str {
        match self {
            UpsertOutcome::Created(_) => "created",
            UpsertOutcome::Updated(_) => "updated",
            UpsertOutcome::Unchanged(_) => "unchanged",
        }
    }

    /// The record as stored after the upsert.
    pub fn server(&self) -> &StoredServer {
        match self {
            UpsertOutcome::Created(s) | UpsertOutcome::Updated(s) | UpsertOutcome::Unchanged(s) => {
                s
            }
        }
    }

    /// Consumes the outcome into the stored record.
    pub fn into_server(self) -> StoredServer {
        match self {
            UpsertOutcome::Created(s) | UpsertOutcome::Updated(s) | UpsertOutcome::Unchanged(s) => {
                s
            }
        }
    }
}

/// Which history rows [`crate::Store::history_page`] returns, across all records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryPage<'a> {
    /// The newest rows, newest first.
    Newest {
        /// Only rows of this record.
        server_id: Option<&'a str>,
        /// At most this many rows.
        limit: u32,
    },
    /// Rows with a revision above `after`, oldest first (paging forward:
    /// pass the last revision of one page as `after` of the next).
    After {
        /// Only revisions above this one.
        after: u64,
        /// Only rows of this record.
        server_id: Option<&'a str>,
        /// At most this many rows.
        limit: u32,
    },
}

/// One history row of any record, with the revision of the same record
/// that came before it (what the change is a change against).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRow {
    /// The record.
    pub server_id: String,
    /// The revision.
    pub entry: HistoryEntry,
    /// The record's previous history row; `None` for its first revision.
    pub previous: Option<HistoryEntry>,
}

fn spec_from_json(text: &str) -> Result<McpServerSpec, StoreError> {
    serde_json::from_str(text).map_err(|err| StoreError::Corrupt(format!("stored record: {err}")))
}

fn spec_to_json(spec: &McpServerSpec) -> Result<String, StoreError> {
    serde_json::to_string(spec).map_err(|err| StoreError::Corrupt(format!("record to json: {err}")))
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

/// The statement of [`crate::Store::history_page`]: history rows with revision >
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

impl SqlStore {
    async fn current(
        &self,
        tx: &mut WriteTx,
        server_id: &str,
    ) -> Result<Option<StoredServer>, StoreError> {
        sqlx::query(self.dialect().select_server)
            .bind(server_id.to_owned())
            .fetch_optional(&mut **tx)
            .await?
            .map(|row| server_from_row(&row))
            .transpose()
    }

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
        sqlx::query(self.dialect().put_server)
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

    /// The batch of [`crate::Store::apply`], validated and free of duplicate ids.
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
        if let Some(function) = self.dialect().upsert_function {
            // The first record that changes takes the head lock inside the
            // function; it is held until the commit below, so the batch's
            // revisions are one contiguous range (see the migration).
            let mut tx = self.pool().begin_with(self.dialect().begin_write).await?;
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

    /// [`Store::list`](crate::Store::list).
    pub(crate) async fn servers_list(&self) -> Result<Snapshot, StoreError> {
        let mut tx = self
            .pool()
            .begin_with(self.dialect().begin_snapshot)
            .await?;
        let (revision, _) = read_head(&mut *tx).await?;
        let rows = sqlx::query(self.dialect().select_servers)
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

    /// [`Store::get`](crate::Store::get).
    pub(crate) async fn servers_get(
        &self,
        server_id: &str,
    ) -> Result<Option<StoredServer>, StoreError> {
        sqlx::query(self.dialect().select_server)
            .bind(server_id.to_owned())
            .fetch_optional(self.pool())
            .await?
            .map(|row| server_from_row(&row))
            .transpose()
    }

    /// [`Store::upsert`](crate::Store::upsert).
    pub(crate) async fn servers_upsert(
        &self,
        request: UpsertRequest,
    ) -> Result<UpsertOutcome, StoreError> {
        validate(&request.spec)?;
        if let Some(function) = self.dialect().upsert_function {
            // One statement, autocommit: the head stays locked only while the
            // function runs on the server and the commit flushes.
            let outcome = self
                .call_upsert_function(self.pool(), function, request)
                .await?;
            if !matches!(outcome, UpsertOutcome::Unchanged(_)) {
                self.publish_revision(outcome.server().revision);
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

    /// [`Store::apply`](crate::Store::apply).
    pub(crate) async fn servers_apply(
        &self,
        requests: Vec<UpsertRequest>,
    ) -> Result<Vec<UpsertOutcome>, StoreError> {
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
            self.publish_revision(revision);
        }
        Ok(outcomes)
    }

    /// [`Store::delete`](crate::Store::delete).
    pub(crate) async fn servers_delete(&self, request: DeleteRequest) -> Result<u64, StoreError> {
        let (mut tx, (head, _), _turn) = self.begin_write().await?;
        let result = self.delete_in(&mut tx, head, &request).await;
        self.finish_write(tx, result, |revision| Some(*revision))
            .await
    }

    /// [`Store::history`](crate::Store::history).
    pub(crate) async fn servers_history(
        &self,
        server_id: &str,
    ) -> Result<Vec<HistoryEntry>, StoreError> {
        let rows = sqlx::query(self.dialect().select_history)
            .bind(server_id.to_owned())
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(history_from_row).collect()
    }

    /// [`Store::history_page`](crate::Store::history_page).
    pub(crate) async fn servers_history_page(
        &self,
        page: HistoryPage<'_>,
    ) -> Result<Vec<HistoryRow>, StoreError> {
        let (after, server_id, limit, newest_first) = match page {
            HistoryPage::Newest { server_id, limit } => (0, server_id, limit, true),
            HistoryPage::After {
                after,
                server_id,
                limit,
            } => (after, server_id, limit, false),
        };
        let sql = history_page_sql(self.dialect(), server_id.is_some(), newest_first);
        // Built from static fragments only; every value is a bound parameter.
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(cursor(after));
        if let Some(server_id) = server_id {
            query = query.bind(server_id.to_owned());
        }
        let rows = query.bind(i64::from(limit)).fetch_all(self.pool()).await?;
        rows.iter().map(history_row_from_row).collect()
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
