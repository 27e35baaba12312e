//! The worker's client of the registry's approvals (docs/reference.md
//! §13.7): it asks for an approval of a call and uses one, on the replica
//! the sync follows, with the worker token and the sync's request timeout.

use std::sync::Arc;

use quiver_model::approval::{UseOutcome, canonical_arguments_hash};
use quiver_proto::v1 as pb;

use crate::SyncError;
use crate::client::Connector;

/// What a call is bound to.
#[derive(Debug, Clone)]
pub struct CallBinding<'a> {
    /// The caller's task.
    pub task: &'a str,
    /// The server.
    pub server_id: &'a str,
    /// The tool (its raw MCP name).
    pub tool: &'a str,
    /// The call's arguments.
    pub arguments: &'a serde_json::Value,
    /// The record's revision.
    pub record_revision: u64,
    /// The caller the call is for: its principal (`token:<tag>`), which
    /// the registry records as `requested_by`/`used_by` and caps pending
    /// approvals by.
    pub caller: &'a str,
}

/// Asks for and uses approvals; cheap to clone.
#[derive(Clone)]
pub struct RegistryApprovals {
    pub(crate) connector: Arc<Connector>,
    /// This worker's id (the registry audits it).
    pub(crate) worker_id: String,
}

impl RegistryApprovals {
    /// Asks for an approval of the call; returns its id.
    pub async fn request(&self, call: &CallBinding<'_>) -> Result<String, SyncError> {
        let request = pb::RequestApprovalRequest {
            task: call.task.to_owned(),
            server_id: call.server_id.to_owned(),
            tool: call.tool.to_owned(),
            arguments_json: call.arguments.to_string(),
            arguments_hash: canonical_arguments_hash(call.arguments),
            record_revision: call.record_revision,
            requested_by: call.caller.to_owned(),
            worker_id: self.worker_id.clone(),
        };
        let response = self
            .connector
            .approval_call("request approval", |mut client| async move {
                client.request_approval(request).await
            })
            .await?;
        response
            .approval
            .map(|approval| approval.approval_id)
            .ok_or_else(|| SyncError::InvalidOptions("the registry answered no approval".into()))
    }

    /// Uses approval `approval_id` for the call: [`UseOutcome::Used`] means
    /// the call may run, once.
    pub async fn use_for(
        &self,
        approval_id: &str,
        call: &CallBinding<'_>,
    ) -> Result<UseOutcome, SyncError> {
        let request = pb::UseApprovalRequest {
            approval_id: approval_id.to_owned(),
            task: call.task.to_owned(),
            server_id: call.server_id.to_owned(),
            tool: call.tool.to_owned(),
            arguments_hash: canonical_arguments_hash(call.arguments),
            record_revision: call.record_revision,
            used_by: call.caller.to_owned(),
            worker_id: self.worker_id.clone(),
        };
        let response = self
            .connector
            .approval_call("use approval", |mut client| async move {
                client.use_approval(request).await
            })
            .await?;
        quiver_proto::approval::use_outcome_from(response.outcome, &response.mismatch_field)
            .map_err(|err| SyncError::InvalidOptions(format!("use approval answer: {err}")))
    }
}
