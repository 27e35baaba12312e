//! Approvals (docs/reference.md §13.7), one implementation for both
//! backends: every statement is plain SQL both engines run unchanged.
//!
//! Deciding and using are each one conditional `UPDATE … RETURNING`, so two
//! workers (or two registry replicas) racing for the same approval cannot
//! both win: the engine serialises the row update and the loser's condition
//! no longer holds. Only when the update matched nothing is the row read
//! again, to say why.

use chrono::{DateTime, Utc};
use quiver_model::approval::{
    Approval, ApprovalBinding, ApprovalDecision, ApprovalState, UseOutcome,
};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::error::StoreError;
use crate::sql::SqlStore;

/// A new approval request (docs/reference.md §13.7).
#[derive(Debug, Clone)]
pub struct NewApproval {
    /// The call it is for.
    pub binding: ApprovalBinding,
    /// The call's arguments (hashed into `binding.arguments_hash`).
    pub arguments: serde_json::Value,
    /// Who asks (audit).
    pub requested_by: String,
    /// How long it may wait for a decision and then for its use.
    pub ttl: chrono::Duration,
    /// The most pending approvals one `requested_by` may have; a request
    /// beyond is refused with [`StoreError::Limit`] naming it.
    pub max_pending: u32,
}

/// What a request for an approval did.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestedApproval {
    /// The approval the request is answered with.
    pub approval: Approval,
    /// `true` when an identical pending request (same `requested_by` and
    /// binding) already existed: this is that one, nothing was stored.
    pub merged: bool,
}

/// What a decision on an approval did.
#[derive(Debug, Clone, PartialEq)]
pub enum DecideOutcome {
    /// It was pending and unexpired: now approved or denied.
    Decided(Approval),
    /// No approval has this id.
    NotFound,
    /// It was no longer pending (decided, used or expired); unchanged.
    NotPending(Approval),
}

const COLUMNS: &str = "approval_id, state, task, server_id, tool, arguments, arguments_hash, \
     record_revision, requested_by, requested_at_ms, expires_at_ms, decided_by, decided_at_ms, \
     note, used_at_ms, used_by";

/// Inserts a pending approval unless `requested_by` ($8) already has
/// $11 or more pending ones, or an identical one is pending (the unique
/// index `approvals_pending_call`: nothing inserted, no error).
fn insert_sql() -> String {
    format!(
        "INSERT INTO approvals ({COLUMNS}) \
         SELECT $1, 'pending', $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, NULL, NULL, NULL, NULL \
         WHERE (SELECT COUNT(*) FROM approvals WHERE requested_by = $8 AND state = 'pending') < $11 \
         ON CONFLICT DO NOTHING"
    )
}

/// The pending approval of an identical request: $1 requested_by, then the
/// binding ($2 task, $3 server_id, $4 tool, $5 arguments_hash, $6
/// record_revision).
fn pending_same_sql() -> String {
    format!(
        "SELECT {COLUMNS} FROM approvals WHERE state = 'pending' AND requested_by = $1 \
         AND task = $2 AND server_id = $3 AND tool = $4 AND arguments_hash = $5 \
         AND record_revision = $6"
    )
}

/// Decided, used and expired approvals whose expiry is before $1, at most
/// $2 of them, oldest first.
const PURGE_SQL: &str = "DELETE FROM approvals WHERE approval_id IN (\
     SELECT approval_id FROM approvals WHERE state IN ('denied', 'used', 'expired') \
     AND expires_at_ms < $1 ORDER BY expires_at_ms LIMIT $2)";

fn select_one_sql() -> String {
    format!("SELECT {COLUMNS} FROM approvals WHERE approval_id = $1")
}

/// Newest first; when every state is listed, pending ones come first.
fn list_sql(by_state: bool) -> String {
    if by_state {
        format!(
            "SELECT {COLUMNS} FROM approvals WHERE state = $1 \
             ORDER BY requested_at_ms DESC, approval_id LIMIT $2"
        )
    } else {
        format!(
            "SELECT {COLUMNS} FROM approvals \
             ORDER BY CASE WHEN state = 'pending' THEN 0 ELSE 1 END, requested_at_ms DESC, \
             approval_id LIMIT $1"
        )
    }
}

/// Pending or approved approvals past their expiry become `expired`.
fn expire_sql() -> String {
    format!(
        "UPDATE approvals SET state = 'expired' \
         WHERE state IN ('pending', 'approved') AND expires_at_ms <= $1 RETURNING {COLUMNS}"
    )
}

/// $1 new state, $2 decided_by, $3 now, $4 note, $5 id.
fn decide_sql() -> String {
    format!(
        "UPDATE approvals SET state = $1, decided_by = $2, decided_at_ms = $3, note = $4 \
         WHERE approval_id = $5 AND state = 'pending' AND expires_at_ms > $3 RETURNING {COLUMNS}"
    )
}

/// $1 now, $2 used_by, $3 id, then the binding: $4 task, $5 server_id,
/// $6 tool, $7 arguments_hash, $8 record_revision.
fn use_sql() -> String {
    format!(
        "UPDATE approvals SET state = 'used', used_at_ms = $1, used_by = $2 \
         WHERE approval_id = $3 AND state = 'approved' AND expires_at_ms > $1 \
         AND task = $4 AND server_id = $5 AND tool = $6 AND arguments_hash = $7 \
         AND record_revision = $8 RETURNING {COLUMNS}"
    )
}

fn millis(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

fn from_millis(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {ms} out of range")))
}

fn revision_param(revision: u64) -> Result<i64, StoreError> {
    i64::try_from(revision)
        .map_err(|_| StoreError::Corrupt(format!("record revision {revision} out of range")))
}

fn approval_from_row(row: &AnyRow) -> Result<Approval, StoreError> {
    let state: String = row.try_get(1)?;
    let arguments: String = row.try_get(5)?;
    let revision: i64 = row.try_get(7)?;
    let optional_time = |index: usize| -> Result<Option<DateTime<Utc>>, StoreError> {
        row.try_get::<Option<i64>, _>(index)?
            .map(from_millis)
            .transpose()
    };
    Ok(Approval {
        approval_id: row.try_get(0)?,
        state: state
            .parse()
            .map_err(|err: quiver_model::approval::UnknownApprovalState| {
                StoreError::Corrupt(err.to_string())
            })?,
        binding: ApprovalBinding {
            task: row.try_get(2)?,
            server_id: row.try_get(3)?,
            tool: row.try_get(4)?,
            arguments_hash: row.try_get(6)?,
            record_revision: u64::try_from(revision)
                .map_err(|_| StoreError::Corrupt(format!("negative revision {revision}")))?,
        },
        arguments: serde_json::from_str(&arguments)
            .map_err(|err| StoreError::Corrupt(format!("stored approval arguments: {err}")))?,
        requested_by: row.try_get(8)?,
        requested_at: from_millis(row.try_get(9)?)?,
        expires_at: from_millis(row.try_get(10)?)?,
        decided_by: row.try_get(11)?,
        decided_at: optional_time(12)?,
        note: row.try_get(13)?,
        used_at: optional_time(14)?,
        used_by: row.try_get(15)?,
    })
}

/// A fresh approval id: 128 random bits as hex behind a prefix that says
/// what it is, safe in URLs and logs as is.
fn new_approval_id() -> String {
    let bits: u128 = rand::random();
    format!("apr_{bits:032x}")
}

/// Why an approved, unexpired approval's update failed: its state, or the
/// first bound field the call did not match.
fn explain_refusal(approval: &Approval, call: &ApprovalBinding, now: DateTime<Utc>) -> UseOutcome {
    let live = matches!(
        approval.state,
        ApprovalState::Pending | ApprovalState::Approved
    );
    if live && approval.expires_at <= now {
        return UseOutcome::Expired;
    }
    match approval.state {
        ApprovalState::Pending => UseOutcome::Pending,
        ApprovalState::Denied => UseOutcome::Denied,
        ApprovalState::Used => UseOutcome::AlreadyUsed,
        ApprovalState::Expired => UseOutcome::Expired,
        ApprovalState::Approved => match approval.binding.mismatch(call) {
            Some(field) => UseOutcome::Mismatch(field),
            // Matched now but not when updated: another call used it between.
            None => UseOutcome::AlreadyUsed,
        },
    }
}

impl SqlStore {
    pub(crate) async fn approvals_create(
        &self,
        request: NewApproval,
    ) -> Result<RequestedApproval, StoreError> {
        if let Some(approval) = self.approvals_pending_same(&request).await? {
            return Ok(RequestedApproval {
                approval,
                merged: true,
            });
        }
        let arguments = serde_json::to_string(&request.arguments)
            .map_err(|err| StoreError::Corrupt(format!("approval arguments to json: {err}")))?;
        let now = Utc::now();
        let approval_id = new_approval_id();
        let inserted = sqlx::query(sqlx::AssertSqlSafe(insert_sql()))
            .bind(approval_id.clone())
            .bind(request.binding.task.clone())
            .bind(request.binding.server_id.clone())
            .bind(request.binding.tool.clone())
            .bind(arguments)
            .bind(request.binding.arguments_hash.clone())
            .bind(revision_param(request.binding.record_revision)?)
            .bind(request.requested_by.clone())
            .bind(millis(now))
            .bind(millis(now + request.ttl))
            .bind(i64::from(request.max_pending))
            .execute(self.pool())
            .await?
            .rows_affected();
        if inserted == 0 {
            // An identical request won the race, or the cap is reached.
            if let Some(approval) = self.approvals_pending_same(&request).await? {
                return Ok(RequestedApproval {
                    approval,
                    merged: true,
                });
            }
            return Err(StoreError::Limit(format!(
                "requested_by {:?} already has {} pending approvals, the most one caller may \
                 have (max_pending_approvals): wait for decisions or expiry",
                request.requested_by, request.max_pending
            )));
        }
        let approval = self
            .approvals_get(&approval_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("approval {approval_id} vanished")))?;
        Ok(RequestedApproval {
            approval,
            merged: false,
        })
    }

    async fn approvals_pending_same(
        &self,
        request: &NewApproval,
    ) -> Result<Option<Approval>, StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(pending_same_sql()))
            .bind(request.requested_by.clone())
            .bind(request.binding.task.clone())
            .bind(request.binding.server_id.clone())
            .bind(request.binding.tool.clone())
            .bind(request.binding.arguments_hash.clone())
            .bind(revision_param(request.binding.record_revision)?)
            .fetch_optional(self.pool())
            .await?
            .map(|row| approval_from_row(&row))
            .transpose()
    }

    pub(crate) async fn approvals_purge(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<u64, StoreError> {
        Ok(sqlx::query(PURGE_SQL)
            .bind(millis(before))
            .bind(i64::from(limit))
            .execute(self.pool())
            .await?
            .rows_affected())
    }

    pub(crate) async fn approvals_get(
        &self,
        approval_id: &str,
    ) -> Result<Option<Approval>, StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(select_one_sql()))
            .bind(approval_id.to_owned())
            .fetch_optional(self.pool())
            .await?
            .map(|row| approval_from_row(&row))
            .transpose()
    }

    pub(crate) async fn approvals_list(
        &self,
        state: Option<ApprovalState>,
        limit: u32,
    ) -> Result<Vec<Approval>, StoreError> {
        let mut query = sqlx::query(sqlx::AssertSqlSafe(list_sql(state.is_some())));
        if let Some(state) = state {
            query = query.bind(state.as_str());
        }
        let rows = query.bind(i64::from(limit)).fetch_all(self.pool()).await?;
        rows.iter().map(approval_from_row).collect()
    }

    pub(crate) async fn approvals_expire(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<Approval>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(expire_sql()))
            .bind(millis(now))
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(approval_from_row).collect()
    }

    pub(crate) async fn approvals_decide(
        &self,
        approval_id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        note: Option<String>,
    ) -> Result<DecideOutcome, StoreError> {
        let now = Utc::now();
        let decided = sqlx::query(sqlx::AssertSqlSafe(decide_sql()))
            .bind(decision.state().as_str())
            .bind(decided_by.to_owned())
            .bind(millis(now))
            .bind(note)
            .bind(approval_id.to_owned())
            .fetch_optional(self.pool())
            .await?;
        if let Some(row) = decided {
            return Ok(DecideOutcome::Decided(approval_from_row(&row)?));
        }
        Ok(match self.approvals_get(approval_id).await? {
            None => DecideOutcome::NotFound,
            Some(mut approval) => {
                if approval.state == ApprovalState::Pending && approval.expires_at <= now {
                    approval.state = ApprovalState::Expired;
                }
                DecideOutcome::NotPending(approval)
            }
        })
    }

    pub(crate) async fn approvals_use(
        &self,
        approval_id: &str,
        call: &ApprovalBinding,
        used_by: &str,
    ) -> Result<(UseOutcome, Option<Approval>), StoreError> {
        let now = Utc::now();
        let used = sqlx::query(sqlx::AssertSqlSafe(use_sql()))
            .bind(millis(now))
            .bind(used_by.to_owned())
            .bind(approval_id.to_owned())
            .bind(call.task.clone())
            .bind(call.server_id.clone())
            .bind(call.tool.clone())
            .bind(call.arguments_hash.clone())
            .bind(revision_param(call.record_revision)?)
            .fetch_optional(self.pool())
            .await?;
        if let Some(row) = used {
            return Ok((UseOutcome::Used, Some(approval_from_row(&row)?)));
        }
        Ok(match self.approvals_get(approval_id).await? {
            None => (UseOutcome::NotFound, None),
            Some(mut approval) => {
                let outcome = explain_refusal(&approval, call, now);
                if outcome == UseOutcome::Expired {
                    approval.state = ApprovalState::Expired;
                }
                (outcome, Some(approval))
            }
        })
    }
}
