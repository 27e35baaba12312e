//! Approvals at the gateway (§13.7 **R-APPR-2**): the approval the client
//! names in `_meta["quiver/approval_id"]` is used; without one, an approval
//! is requested and the person at the client, if it can be asked, is asked
//! to accept once an approver approved it — by elicitation on a session, by
//! `input_required` without one (the approval's id travels in the request
//! state until it is decided); otherwise the refusal carries the
//! approval's id.

use futures::future::BoxFuture;
use rmcp::RoleServer;
use rmcp::model::{ElicitRequestParams, ElicitationAction};
use rmcp::service::Peer;

use crate::approval::{AskApproval, Cleared, Pending};
use crate::call::CallError;
use crate::catalog::CatalogTool;
use crate::gateway::round::{ApprovalStep, Round, empty_form};

/// The `_meta` key of a `tools/call` that names its approval (§13.7).
pub const APPROVAL_META: &str = "quiver/approval_id";

/// Asks a gateway client about a call's approval, in the protocol it speaks.
pub struct AskInProtocol<'a> {
    /// The client, on a session (asked by elicitation); `None` without one.
    pub peer: Option<&'a Peer<RoleServer>>,
    /// The approval the client named in `_meta`.
    pub named: Option<String>,
    /// The request's round (2026-07-28); `None` on a session.
    pub round: Option<&'a Round>,
}

impl AskApproval for AskInProtocol<'_> {
    fn settle<'p>(&'p self, pending: Pending<'p>) -> BoxFuture<'p, Result<Cleared, CallError>> {
        Box::pin(async move {
            if let Some(id) = &self.named {
                let cleared = pending.use_id(id).await?;
                if let Some(round) = self.round {
                    round.approval_used(id.clone());
                }
                return Ok(cleared);
            }
            match self.round {
                Some(round) => in_round(round, pending).await,
                None => self.on_session(pending).await,
            }
        })
    }
}

impl AskInProtocol<'_> {
    /// On a session: the person at the client is asked by elicitation and
    /// the call waits (at most the tool's timeout) for the answer.
    async fn on_session(&self, pending: Pending<'_>) -> Result<Cleared, CallError> {
        let id = pending.request().await?;
        if !self.elicit(pending.tool(), &id).await {
            return Err(pending.waiting_for(&id));
        }
        pending.use_id(&id).await
    }

    /// Asks the person at the client to accept once approval `id` is
    /// approved; `false` when the client cannot be asked or did not accept
    /// within the tool's timeout.
    async fn elicit(&self, tool: &CatalogTool, id: &str) -> bool {
        let Some(peer) = self.peer else {
            return false;
        };
        let can_ask = peer
            .peer_info()
            .is_some_and(|info| info.capabilities.elicitation.is_some());
        if !can_ask {
            return false;
        }
        let asked = peer.create_elicitation(ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: question(tool, id),
            requested_schema: empty_form(),
        });
        let wait = std::time::Duration::from_millis(tool.server.spec.budgets.tool_timeout_ms);
        matches!(
            tokio::time::timeout(wait, asked).await,
            Ok(Ok(answer)) if answer.action == ElicitationAction::Accept
        )
    }
}

/// Without a session (2026-07-28): the round ends asking the client to
/// accept once an approver decided; the retry carries the approval's id in
/// its state and runs once it is approved.
async fn in_round(round: &Round, pending: Pending<'_>) -> Result<Cleared, CallError> {
    match round.approval() {
        ApprovalStep::Used(_) => Ok(pending.used_in_earlier_round()),
        ApprovalStep::Waiting(id) => {
            if round.approval_answer() == Some(false) {
                return Err(CallError::ApprovalRequired {
                    message: format!(
                        "{}.{} requires an approval: the client declined to wait for approval {id}",
                        pending.tool().server_id(),
                        pending.tool().tool_name()
                    ),
                    approval_id: Some(id),
                });
            }
            match pending.use_if_decided(&id).await? {
                Some(cleared) => {
                    round.approval_used(id);
                    Ok(cleared)
                }
                None => {
                    let message = question(pending.tool(), &id);
                    Err(CallError::Asking(Box::new(round.ask_approval(id, message))))
                }
            }
        }
        ApprovalStep::NotAsked => {
            let id = pending.request().await?;
            if !round.can_ask() {
                return Err(pending.waiting_for(&id));
            }
            let message = question(pending.tool(), &id);
            Err(CallError::Asking(Box::new(round.ask_approval(id, message))))
        }
    }
}

/// What the person at the client is asked while a call waits for approval.
fn question(tool: &CatalogTool, id: &str) -> String {
    format!(
        "{}.{} needs an approval. Ask an approver to approve {id} (web admin, Approvals), then accept.",
        tool.server_id(),
        tool.tool_name()
    )
}
