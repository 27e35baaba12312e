//! Access records (docs/reference.md §12.2): policies, API keys and identity
//! providers, one implementation for both backends.
//!
//! They take their revisions from the same head as server records, under the
//! same writer lock ([`SqlStore::begin_write`]), with a change-log row (its
//! `access_kind` set) and an `access_history` row, so one revision stream
//! orders every change of configuration. References (a key's or a rule's
//! policy) are checked inside the writing transaction: writers are
//! serialised on the head, so a policy found there cannot be deleted before
//! the record naming it commits, and a policy still named cannot be deleted.
//!
//! Reads are plain SQL both engines run unchanged (`CAST(spec AS TEXT)` reads
//! the JSON column as text on both); the statements writing JSON are the
//! dialect's ([`crate::sql::Dialect::put_access`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use quiver_model::access::{AccessKind, AccessSpec, StoredAccess};
use quiver_model::{ChangeKind, ModelError, Source};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::error::StoreError;
use crate::sql::{
    ChangeRow, SqlStore, WriteTx, access_kind_from, check_expected, cursor, from_millis,
    keeps_identical, kind_from, millis, source_from, to_i64, to_u64,
};

/// A create-or-replace of an access record.
#[derive(Debug, Clone)]
pub struct AccessPut {
    /// The new content (its kind and name are its key).
    pub spec: AccessSpec,
    /// `Some(0)`: must not exist; `Some(n)`: current revision must be `n`.
    pub expected_revision: Option<u64>,
    /// Who writes (audit).
    pub actor: String,
    /// Where the content comes from.
    pub source: Source,
}

/// A delete of an access record.
#[derive(Debug, Clone)]
pub struct AccessDelete {
    /// Its kind.
    pub kind: AccessKind,
    /// Its name within its kind.
    pub name: String,
    /// `Some(n)`: current revision must be `n`.
    pub expected_revision: Option<u64>,
    /// Who deletes (audit).
    pub actor: String,
    /// Where the delete comes from.
    pub source: Source,
}

/// What a put of an access record did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessOutcome {
    /// It did not exist.
    Created(StoredAccess),
    /// It changed (new revision).
    Updated(StoredAccess),
    /// Identical content: nothing written, the stored record is returned.
    Unchanged(StoredAccess),
}

impl AccessOutcome {
    /// The record as stored after the put.
    pub fn record(&self) -> &StoredAccess {
        match self {
            AccessOutcome::Created(r) | AccessOutcome::Updated(r) | AccessOutcome::Unchanged(r) => {
                r
            }
        }
    }
}

/// One revision of one access record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessHistoryEntry {
    /// The revision.
    pub revision: u64,
    /// The record's kind.
    pub access: AccessKind,
    /// Its name within its kind.
    pub name: String,
    /// Upsert or delete.
    pub kind: ChangeKind,
    /// Full content as of this revision; `None` for deletes.
    pub spec: Option<AccessSpec>,
    /// Commit time.
    pub at: DateTime<Utc>,
    /// Who made it.
    pub actor: String,
    /// Where it came from.
    pub source: Source,
}

/// The most key uses one report ([`crate::Store::touch_api_keys`]) may hold.
const MAX_TOUCHED_KEYS: usize = 10_000;

/// $1 kind, $2 name. Columns as [`record_from_row`] reads them.
const SELECT_RECORD: &str = "SELECT kind, name, CAST(spec AS TEXT), revision, created_at_ms, \
     updated_at_ms, updated_by, source FROM access_records WHERE kind = $1 AND name = $2";
/// Unordered: [`all_records`] sorts them the same way on both engines.
const SELECT_RECORDS: &str = "SELECT kind, name, CAST(spec AS TEXT), revision, created_at_ms, \
     updated_at_ms, updated_by, source FROM access_records";
/// $1 name.
const POLICY_EXISTS: &str = "SELECT 1 FROM access_records WHERE kind = 'policy' AND name = $1";
/// $1 kind, $2 name.
const DELETE_RECORD: &str = "DELETE FROM access_records WHERE kind = $1 AND name = $2";
/// $1 key id.
const DELETE_USAGE: &str = "DELETE FROM api_key_usage WHERE key_id = $1";
/// $1 kind, $2 name; newest first. Columns as [`history_from_row`] reads them.
const SELECT_HISTORY: &str = "SELECT revision, kind, name, change, CAST(spec AS TEXT), at_ms, \
     actor, source FROM access_history WHERE kind = $1 AND name = $2 ORDER BY revision DESC";
/// $1 revision.
const SELECT_HISTORY_AT: &str = "SELECT revision, kind, name, change, CAST(spec AS TEXT), at_ms, \
     actor, source FROM access_history WHERE revision = $1";
/// $1 key id, $2 time of use. Ids of no key are skipped; the stored time only
/// moves forward.
const TOUCH_KEY: &str = "INSERT INTO api_key_usage (key_id, last_used_at_ms) \
     SELECT $1, $2 WHERE EXISTS \
     (SELECT 1 FROM access_records WHERE kind = 'api_key' AND name = $1) \
     ON CONFLICT (key_id) DO UPDATE SET last_used_at_ms = excluded.last_used_at_ms \
     WHERE excluded.last_used_at_ms > api_key_usage.last_used_at_ms";
/// A use reported while its key was being deleted can insert a row after the
/// delete removed it (the existence check ran before the delete committed);
/// the join keeps such a row out.
const SELECT_USAGE: &str = "SELECT u.key_id, u.last_used_at_ms FROM api_key_usage u \
     JOIN access_records r ON r.kind = 'api_key' AND r.name = u.key_id";

/// How a conflict names a record: `<kind>/<name>`.
fn label(kind: AccessKind, name: &str) -> String {
    format!("{kind}/{name}")
}

fn spec_from_json(text: &str) -> Result<AccessSpec, StoreError> {
    serde_json::from_str(text)
        .map_err(|err| StoreError::Corrupt(format!("stored access record: {err}")))
}

fn spec_to_json(spec: &AccessSpec) -> Result<String, StoreError> {
    serde_json::to_string(spec)
        .map_err(|err| StoreError::Corrupt(format!("access record to json: {err}")))
}

/// Columns: kind, name, spec, revision, created_at_ms, updated_at_ms,
/// updated_by, source.
fn record_from_row(row: &AnyRow) -> Result<StoredAccess, StoreError> {
    let kind = access_kind_from(&row.try_get::<String, _>(0)?)?;
    let name: String = row.try_get(1)?;
    let spec = spec_from_json(&row.try_get::<String, _>(2)?)?;
    if spec.kind() != kind || spec.name() != name {
        return Err(StoreError::Corrupt(format!(
            "row {} holds record {}",
            label(kind, &name),
            label(spec.kind(), spec.name())
        )));
    }
    Ok(StoredAccess {
        spec,
        revision: to_u64(row.try_get(3)?)?,
        created_at: from_millis(row.try_get(4)?)?,
        updated_at: from_millis(row.try_get(5)?)?,
        updated_by: row.try_get(6)?,
        source: source_from(&row.try_get::<String, _>(7)?)?,
    })
}

/// Columns: revision, kind, name, change, spec (nullable), at_ms, actor,
/// source.
fn history_from_row(row: &AnyRow) -> Result<AccessHistoryEntry, StoreError> {
    let spec: Option<String> = row.try_get(4)?;
    Ok(AccessHistoryEntry {
        revision: to_u64(row.try_get(0)?)?,
        access: access_kind_from(&row.try_get::<String, _>(1)?)?,
        name: row.try_get(2)?,
        kind: kind_from(&row.try_get::<String, _>(3)?)?,
        spec: spec.as_deref().map(spec_from_json).transpose()?,
        at: from_millis(row.try_get(5)?)?,
        actor: row.try_get(6)?,
        source: source_from(&row.try_get::<String, _>(7)?)?,
    })
}

async fn record<'e, E>(
    executor: E,
    kind: AccessKind,
    name: &str,
) -> Result<Option<StoredAccess>, StoreError>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    sqlx::query(SELECT_RECORD)
        .bind(kind.as_str())
        .bind(name.to_owned())
        .fetch_optional(executor)
        .await?
        .map(|row| record_from_row(&row))
        .transpose()
}

/// Every access record, ordered by kind ([`AccessKind`]'s order) then name
/// (bytewise): sorted here, because the engines' text collations may differ.
pub(crate) async fn all_records<'e, E>(executor: E) -> Result<Vec<StoredAccess>, StoreError>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    let rows = sqlx::query(SELECT_RECORDS).fetch_all(executor).await?;
    let mut records = rows
        .iter()
        .map(record_from_row)
        .collect::<Result<Vec<_>, _>>()?;
    records.sort_by(|a, b| (a.spec.kind(), a.spec.name()).cmp(&(b.spec.kind(), b.spec.name())));
    Ok(records)
}

/// The field of `spec` that names `policy`: a key's `policy`, or the first
/// provider rule naming it.
fn reference_field(spec: &AccessSpec, policy: &str) -> String {
    match spec {
        AccessSpec::IdentityProvider(provider) => provider
            .rules
            .iter()
            .position(|rule| rule.policy.as_deref() == Some(policy))
            .map_or_else(|| "rules".to_owned(), |at| format!("rules[{at}].policy")),
        AccessSpec::ApiKey(_) | AccessSpec::Policy(_) => "policy".to_owned(),
    }
}

/// Refuses `spec` when a policy it names does not exist.
async fn check_references(tx: &mut WriteTx, spec: &AccessSpec) -> Result<(), StoreError> {
    for policy in spec.policies_named() {
        let exists = sqlx::query(POLICY_EXISTS)
            .bind(policy.to_owned())
            .fetch_optional(&mut **tx)
            .await?
            .is_some();
        if !exists {
            return Err(StoreError::MissingReference {
                field: reference_field(spec, policy),
                kind: AccessKind::Policy,
                name: policy.to_owned(),
            });
        }
    }
    Ok(())
}

/// The records naming policy `name`: `api_key:<id>`,
/// `identity_provider:<name>`.
async fn users_of(tx: &mut WriteTx, name: &str) -> Result<Vec<String>, StoreError> {
    Ok(all_records(&mut **tx)
        .await?
        .into_iter()
        .filter(|other| other.spec.policies_named().contains(name))
        .map(|other| format!("{}:{}", other.spec.kind(), other.spec.name()))
        .collect())
}

impl SqlStore {
    pub(crate) async fn access_put(&self, request: AccessPut) -> Result<AccessOutcome, StoreError> {
        request
            .spec
            .validate()
            .map_err(|field| ModelError::Invalid(vec![field]))?;
        let (mut tx, (head, _), _turn) = self.begin_write().await?;
        let result = self.access_put_in(&mut tx, head, request).await;
        self.finish_write(tx, result, |outcome| match outcome {
            AccessOutcome::Unchanged(_) => None,
            written => Some(written.record().revision),
        })
        .await
    }

    /// The checks and writes of one put inside a write transaction that
    /// holds the writer lock, at `head`. Writes nothing when refused or for
    /// identical content; the caller commits or rolls back.
    async fn access_put_in(
        &self,
        tx: &mut WriteTx,
        head: u64,
        request: AccessPut,
    ) -> Result<AccessOutcome, StoreError> {
        let AccessPut {
            spec,
            expected_revision,
            actor,
            source,
        } = request;
        let (kind, name) = (spec.kind(), spec.name().to_owned());
        let current = record(&mut **tx, kind, &name).await?;
        check_expected(
            &label(kind, &name),
            expected_revision,
            current.as_ref().map(|c| c.revision),
        )?;
        if let Some(current) = &current
            && current.spec == spec
            && keeps_identical(&current.source, &source)
        {
            return Ok(AccessOutcome::Unchanged(current.clone()));
        }
        check_references(tx, &spec).await?;
        let revision = head + 1;
        let now = Utc::now();
        let created_at = current.as_ref().map_or(now, |c| c.created_at);
        let spec_json = spec_to_json(&spec)?;
        sqlx::query(self.dialect().put_access)
            .bind(kind.as_str())
            .bind(name.clone())
            .bind(spec_json.clone())
            .bind(to_i64(revision)?)
            .bind(millis(created_at))
            .bind(millis(now))
            .bind(actor.clone())
            .bind(source.to_string())
            .execute(&mut **tx)
            .await?;
        let change = ChangeRow {
            revision,
            server_id: &name,
            access: Some(kind),
            kind: ChangeKind::Upsert,
            spec_json: Some(spec_json),
            at: now,
            actor: &actor,
            source: &source,
        };
        self.record_change(tx, change).await?;
        let stored = StoredAccess {
            spec,
            revision,
            // Stored with millisecond precision; report what a read returns.
            created_at: from_millis(millis(created_at))?,
            updated_at: from_millis(millis(now))?,
            updated_by: actor,
            source,
        };
        Ok(match current {
            None => AccessOutcome::Created(stored),
            Some(_) => AccessOutcome::Updated(stored),
        })
    }

    pub(crate) async fn access_delete(&self, request: AccessDelete) -> Result<u64, StoreError> {
        let (mut tx, (head, _), _turn) = self.begin_write().await?;
        let result = self.access_delete_in(&mut tx, head, &request).await;
        self.finish_write(tx, result, |revision| Some(*revision))
            .await
    }

    /// The checks and writes of one delete inside a write transaction that
    /// holds the writer lock, at `head`; returns the new revision. Writes
    /// nothing when refused; the caller commits or rolls back.
    async fn access_delete_in(
        &self,
        tx: &mut WriteTx,
        head: u64,
        request: &AccessDelete,
    ) -> Result<u64, StoreError> {
        let (kind, name) = (request.kind, request.name.as_str());
        let current = record(&mut **tx, kind, name).await?;
        check_expected(
            &label(kind, name),
            request.expected_revision,
            current.as_ref().map(|c| c.revision),
        )?;
        if current.is_none() {
            return Err(StoreError::AccessNotFound {
                kind,
                name: name.to_owned(),
            });
        }
        if kind == AccessKind::Policy {
            let used_by = users_of(tx, name).await?;
            if !used_by.is_empty() {
                return Err(StoreError::InUse {
                    kind,
                    name: name.to_owned(),
                    used_by,
                });
            }
        }
        let revision = head + 1;
        sqlx::query(DELETE_RECORD)
            .bind(kind.as_str())
            .bind(name.to_owned())
            .execute(&mut **tx)
            .await?;
        if kind == AccessKind::ApiKey {
            sqlx::query(DELETE_USAGE)
                .bind(name.to_owned())
                .execute(&mut **tx)
                .await?;
        }
        let change = ChangeRow {
            revision,
            server_id: name,
            access: Some(kind),
            kind: ChangeKind::Delete,
            spec_json: None,
            at: Utc::now(),
            actor: &request.actor,
            source: &request.source,
        };
        self.record_change(tx, change).await?;
        Ok(revision)
    }

    pub(crate) async fn access_get(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Option<StoredAccess>, StoreError> {
        record(self.pool(), kind, name).await
    }

    pub(crate) async fn access_history_of(
        &self,
        kind: AccessKind,
        name: &str,
    ) -> Result<Vec<AccessHistoryEntry>, StoreError> {
        let rows = sqlx::query(SELECT_HISTORY)
            .bind(kind.as_str())
            .bind(name.to_owned())
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(history_from_row).collect()
    }

    pub(crate) async fn access_history_at(
        &self,
        revision: u64,
    ) -> Result<Option<AccessHistoryEntry>, StoreError> {
        sqlx::query(SELECT_HISTORY_AT)
            .bind(cursor(revision))
            .fetch_optional(self.pool())
            .await?
            .map(|row| history_from_row(&row))
            .transpose()
    }

    pub(crate) async fn access_touch_api_keys(
        &self,
        used: &[(String, DateTime<Utc>)],
    ) -> Result<(), StoreError> {
        if used.len() > MAX_TOUCHED_KEYS {
            return Err(StoreError::Limit(format!(
                "at most {MAX_TOUCHED_KEYS} api key uses per report, got {}",
                used.len()
            )));
        }
        // One row per key, its latest use, in key order: concurrent reports
        // lock their rows in the same order, so they cannot deadlock.
        let mut latest = BTreeMap::new();
        for (key_id, at) in used {
            let at = millis(*at);
            latest
                .entry(key_id.as_str())
                .and_modify(|seen: &mut i64| *seen = (*seen).max(at))
                .or_insert(at);
        }
        if latest.is_empty() {
            return Ok(());
        }
        let (mut tx, _turn) = self.begin_write_tx().await?;
        for (key_id, at) in latest {
            sqlx::query(TOUCH_KEY)
                .bind(key_id.to_owned())
                .bind(at)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn access_api_keys_last_used(
        &self,
    ) -> Result<BTreeMap<String, DateTime<Utc>>, StoreError> {
        let rows = sqlx::query(SELECT_USAGE).fetch_all(self.pool()).await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, from_millis(row.try_get(1)?)?)))
            .collect()
    }
}
