//! Approvals on the registry (docs/reference.md §13.7): workers request and
//! use them over gRPC, approvers decide them over REST (`/admin/api/approvals`,
//! handled by `rest::approvals`) or the web admin. Every state change is one audit line (target
//! `quiver::audit`) and one count in `quiver_approvals_total{state}`.
//!
//! Expiry is applied lazily: every read and decision first marks approvals
//! past their expiry `expired` (audited once, by whichever replica marks
//! them); the store's use and decide statements also check the expiry
//! themselves, so a sweep that has not run yet never lets one through.

use quiver_model::approval::{
    Approval, ApprovalBinding, ApprovalDecision, ApprovalState, UseOutcome, arguments_from_json,
    canonical_arguments_hash,
};
use quiver_store::{DecideOutcome, NewApproval};

use crate::error::RegistryError;
use crate::state::RegistryState;
// The defaults live with the settings they are defaults of, on the state.
pub use crate::state::{
    DEFAULT_APPROVAL_RETENTION, DEFAULT_APPROVAL_TTL, DEFAULT_MAX_PENDING_PER_CALLER,
};

/// Largest `arguments_json` an approval request may carry.
pub const MAX_ARGUMENTS_BYTES: usize = 256 * 1024;

/// Longest approver note, in characters.
pub const MAX_NOTE_CHARS: usize = 1000;

/// Finished approvals one purge statement deletes, and statements per sweep.
const PURGE_BATCH: u32 = 1000;
const PURGE_BATCHES_PER_SWEEP: u32 = 10;

/// Longest task, server id or tool name an approval binds.
const MAX_NAME_CHARS: usize = 256;

/// A worker's request for an approval (gRPC `RequestApproval`).
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    /// The call it is for; `arguments_hash` as the worker computed it.
    pub binding: ApprovalBinding,
    /// The call's arguments as JSON text.
    pub arguments_json: String,
}

fn audit(approval: &Approval, action: &'static str, actor: &str) {
    audit_via(approval, action, actor, "");
}

/// One audit line; `via` says through what the actor came (the worker's
/// id, or the client's `x-quiver-actor` note), empty when nothing.
fn audit_via(approval: &Approval, action: &'static str, actor: &str, via: &str) {
    metrics::counter!("quiver_approvals_total", "state" => approval.state.as_str()).increment(1);
    tracing::info!(
        target: "quiver::audit",
        action,
        approval_id = %approval.approval_id,
        task = %approval.binding.task,
        server_id = %approval.binding.server_id,
        tool = %approval.binding.tool,
        record_revision = approval.binding.record_revision,
        actor = %actor,
        via = %via,
        "approval"
    );
}

/// Who a worker says asks for (or uses) an approval: the caller's principal
/// it sent (`token:<tag>`), else the credential's role name (a worker that
/// sends none: all its callers are one). Checked like a name.
pub fn caller_principal(
    field: &str,
    supplied: &str,
    role: crate::auth::Role,
) -> Result<String, RegistryError> {
    if supplied.is_empty() {
        return Ok(role.as_str().to_owned());
    }
    check_name(field, supplied)?;
    Ok(supplied.to_owned())
}

fn check_name(field: &str, value: &str) -> Result<(), RegistryError> {
    if value.is_empty() {
        return Err(RegistryError::invalid(field, "must not be empty"));
    }
    if value.chars().count() > MAX_NAME_CHARS || value.chars().any(char::is_control) {
        return Err(RegistryError::invalid(
            field,
            format!("must be at most {MAX_NAME_CHARS} characters without control characters"),
        ));
    }
    Ok(())
}

fn not_found(approval_id: &str) -> RegistryError {
    RegistryError::NotFound(format!("approval {approval_id:?} not found"))
}

impl RegistryState {
    /// Stores a pending approval for one call; refuses malformed input and
    /// an `arguments_hash` that is not the canonical hash of the arguments.
    /// An identical pending request of the same caller (same binding)
    /// answers with that approval; a caller with
    /// [`RegistryState::approval_max_pending`] pending approvals is refused
    /// (`resource_exhausted`). `via` (the worker's id) is audited.
    pub async fn request_approval(
        &self,
        request: ApprovalRequest,
        requested_by: &str,
        via: &str,
    ) -> Result<Approval, RegistryError> {
        let binding = request.binding;
        check_name("task", &binding.task)?;
        check_name("server_id", &binding.server_id)?;
        check_name("tool", &binding.tool)?;
        if request.arguments_json.len() > MAX_ARGUMENTS_BYTES {
            return Err(RegistryError::invalid(
                "arguments_json",
                format!("larger than {MAX_ARGUMENTS_BYTES} bytes"),
            ));
        }
        let arguments = arguments_from_json(&request.arguments_json)
            .map_err(|err| RegistryError::invalid("arguments_json", err.to_string()))?;
        if !arguments.is_object() {
            return Err(RegistryError::invalid(
                "arguments_json",
                "must be a JSON object",
            ));
        }
        let expected = canonical_arguments_hash(&arguments);
        if binding.arguments_hash != expected {
            return Err(RegistryError::invalid(
                "arguments_hash",
                format!(
                    "is not the canonical hash of arguments_json (expected {expected}): \
                     sha256 of the JSON with keys sorted at every depth and no whitespace"
                ),
            ));
        }
        let ttl = chrono::Duration::from_std(self.approval_ttl())
            .map_err(|err| RegistryError::Internal(format!("approval ttl: {err}")))?;
        // A pending approval past its expiry no longer counts or merges.
        self.expire_approvals().await?;
        let requested = self
            .store
            .create_approval(NewApproval {
                binding,
                arguments,
                requested_by: requested_by.to_owned(),
                ttl,
                max_pending: self.approval_max_pending(),
            })
            .await
            .inspect_err(|err| {
                if matches!(err, quiver_store::StoreError::Limit(_)) {
                    metrics::counter!("quiver_approval_request_refusals_total",
                        "reason" => "max_pending")
                    .increment(1);
                }
            })?;
        let action = if requested.merged {
            "approval_request_merged"
        } else {
            "approval_requested"
        };
        audit_via(&requested.approval, action, requested_by, via);
        Ok(requested.approval)
    }

    /// Marks approvals past their expiry `expired`, auditing each once.
    pub async fn expire_approvals(&self) -> Result<(), RegistryError> {
        for approval in self.store.expire_approvals().await? {
            audit(&approval, "approval_expired", "registry");
        }
        Ok(())
    }

    /// Deletes denied, used and expired approvals whose expiry is older
    /// than the retention, in bounded batches; returns how many.
    pub async fn purge_approvals(&self) -> Result<u64, RegistryError> {
        let retention = chrono::Duration::from_std(self.approval_retention())
            .map_err(|err| RegistryError::Internal(format!("approval retention: {err}")))?;
        let before = chrono::Utc::now() - retention;
        let mut purged = 0;
        for _ in 0..PURGE_BATCHES_PER_SWEEP {
            let deleted = self.store.purge_approvals(before, PURGE_BATCH).await?;
            purged += deleted;
            if deleted < u64::from(PURGE_BATCH) {
                break;
            }
        }
        if purged > 0 {
            metrics::counter!("quiver_approvals_purged_total").increment(purged);
            tracing::info!(target: "quiver::audit", action = "approvals_purged", count = purged,
                "approval");
        }
        Ok(purged)
    }

    /// One approval, or NOT_FOUND.
    pub async fn approval(&self, approval_id: &str) -> Result<Approval, RegistryError> {
        self.expire_approvals().await?;
        self.store
            .get_approval(approval_id)
            .await?
            .ok_or_else(|| not_found(approval_id))
    }

    /// Approvals in one state (or all, pending first), newest first.
    pub async fn approvals(
        &self,
        state: Option<ApprovalState>,
        limit: u32,
    ) -> Result<Vec<Approval>, RegistryError> {
        self.expire_approvals().await?;
        Ok(self.store.list_approvals(state, limit).await?)
    }

    /// Approves or denies a pending approval; NOT_FOUND or
    /// `approval_not_pending` (409) otherwise.
    /// `decided_by` is the authenticated credential; `via` a display note
    /// (the client's `x-quiver-actor`), audited only. A blank `note` is
    /// none; one over [`MAX_NOTE_CHARS`] is refused.
    pub async fn decide_approval(
        &self,
        approval_id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        via: &str,
        note: Option<String>,
    ) -> Result<Approval, RegistryError> {
        let note = note.filter(|note| !note.trim().is_empty());
        if let Some(note) = &note
            && note.chars().count() > MAX_NOTE_CHARS
        {
            return Err(RegistryError::invalid(
                "note",
                format!("longer than {MAX_NOTE_CHARS} characters"),
            ));
        }
        self.expire_approvals().await?;
        match self
            .store
            .decide_approval(approval_id, decision, decided_by, note)
            .await?
        {
            DecideOutcome::Decided(approval) => {
                let action = match decision {
                    ApprovalDecision::Approve => "approval_approved",
                    ApprovalDecision::Deny => "approval_denied",
                };
                audit_via(&approval, action, decided_by, via);
                Ok(approval)
            }
            DecideOutcome::NotFound => Err(not_found(approval_id)),
            DecideOutcome::NotPending(approval) => Err(RegistryError::ApprovalNotPending(format!(
                "approval {approval_id:?} is {}, not pending",
                approval.state
            ))),
        }
    }

    /// Uses an approval for one call: exactly one use of an approved,
    /// unexpired approval bound to exactly this call gets
    /// [`UseOutcome::Used`]; refusals are outcomes, not errors.
    /// `used_by` is the caller the worker ran the call for, `via` the
    /// worker's id (audited).
    pub async fn use_approval(
        &self,
        approval_id: &str,
        call: &ApprovalBinding,
        used_by: &str,
        via: &str,
    ) -> Result<(UseOutcome, Option<Approval>), RegistryError> {
        let (outcome, approval) = self.store.use_approval(approval_id, call, used_by).await?;
        match (&outcome, &approval) {
            (UseOutcome::Used, Some(approval)) => {
                audit_via(approval, "approval_used", used_by, via);
            }
            // The store saw it past its expiry: mark (and audit) it now.
            (UseOutcome::Expired, _) => self.expire_approvals().await?,
            _ => {}
        }
        if outcome != UseOutcome::Used {
            metrics::counter!("quiver_approval_use_refusals_total", "reason" => outcome.as_str())
                .increment(1);
        }
        Ok((outcome, approval))
    }
}
