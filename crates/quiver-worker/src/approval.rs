//! Approvals of single calls (docs/reference.md §13.7): how a call whose
//! tool needs one gets it, by surface, and the proof that it did.
//!
//! [`ToolRunner::call`](crate::call::ToolRunner::call) runs a tool only with
//! a [`Cleared`], and only this module makes one: for a tool that needs no
//! approval, or from the registry's answer that an approval of exactly this
//! call was used (once, across the fleet). The [`ApprovalFlow`] says how a
//! surface settles it: the tool API requests or uses an id, chat uses the
//! first of the conversation's ids, the gateway asks in the protocol.

use std::collections::HashSet;
use std::sync::Mutex;

use futures::future::BoxFuture;
use quiver_mcp::McpError;
use quiver_model::approval::UseOutcome;
use quiver_sync::{CallBinding, RegistryApprovals};
use serde_json::Value;

use crate::auth::{CallerId, Task};
use crate::call_error::CallError;
use crate::catalog::CatalogTool;

/// Proof that a call may run: its tool needs no approval, or an approval of
/// exactly this call was used. Not `Clone`: one proof, one run.
#[derive(Debug)]
pub struct Cleared(());

/// How a call whose tool needs an approval gets it.
pub enum ApprovalFlow<'a> {
    /// The caller cannot take part in an approval here: the call is refused
    /// saying where approvals are given.
    Refuse,
    /// The tool API: the named approval is used; without one, an approval is
    /// requested and the call refused carrying its id.
    RequestOrUse(Option<&'a str>),
    /// Chat: the first of the conversation's approvals that is approved for
    /// exactly this call (each used once).
    FirstOf(&'a ApprovalSet),
    /// The gateway: settled in the protocol, asking the person at the client.
    Ask(&'a dyn AskApproval),
}

/// Settles an approval in a protocol that can ask the caller (the gateway).
pub trait AskApproval: Send + Sync {
    /// The proof the call may run, or why not (the refusal, or
    /// [`CallError::Asking`] when the client is asked first).
    fn settle<'p>(&'p self, pending: Pending<'p>) -> BoxFuture<'p, Result<Cleared, CallError>>;
}

/// The approvals a conversation brought (`mcp.approvals`), each used at most
/// once by the calls of its tool loop.
#[derive(Debug, Default)]
pub struct ApprovalSet {
    ids: Vec<String>,
    used: Mutex<HashSet<String>>,
}

impl ApprovalSet {
    /// The set of `ids`, none used yet.
    pub fn new(ids: Vec<String>) -> Self {
        ApprovalSet {
            ids,
            used: Mutex::default(),
        }
    }

    /// Whether the conversation brought none.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn unused(&self) -> Vec<String> {
        let used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        self.ids
            .iter()
            .filter(|id| !used.contains(*id))
            .cloned()
            .collect()
    }

    fn mark_used(&self, id: &str) {
        self.used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_owned());
    }
}

/// A call waiting for its approval: what an approval of it is bound to, and
/// the registry's approvals to settle it with.
pub struct Pending<'a> {
    pub(crate) approvals: Option<&'a RegistryApprovals>,
    pub(crate) task: &'a Task,
    pub(crate) caller: Option<&'a CallerId>,
    pub(crate) tool: &'a CatalogTool,
    /// The arguments, an object.
    pub(crate) arguments: &'a Value,
}

impl Pending<'_> {
    /// The tool called.
    pub fn tool(&self) -> &CatalogTool {
        self.tool
    }

    /// Settles the approval by `mode`.
    pub(crate) async fn settle(self, mode: ApprovalFlow<'_>) -> Result<Cleared, CallError> {
        match mode {
            ApprovalFlow::Refuse => Err(CallError::ApprovalRequired {
                message: format!(
                    "{} requires an approval before it runs (through the tool API, POST /v1/mcp/tools/call)",
                    self.tool_label()
                ),
                approval_id: None,
            }),
            ApprovalFlow::RequestOrUse(Some(id)) => self.use_id(id).await,
            ApprovalFlow::RequestOrUse(None) => {
                let id = self.request().await?;
                Err(self.waiting_for(&id))
            }
            ApprovalFlow::FirstOf(set) => {
                let mut last = CallError::ApprovalInvalid(
                    "none of mcp.approvals is approved for this call".into(),
                );
                for id in set.unused() {
                    match self.use_id(&id).await {
                        Ok(cleared) => {
                            set.mark_used(&id);
                            return Ok(cleared);
                        }
                        // Approved for another call of the conversation: try the next.
                        Err(err @ CallError::ApprovalInvalid(_)) => last = err,
                        Err(err) => return Err(err),
                    }
                }
                Err(last)
            }
            ApprovalFlow::Ask(asker) => asker.settle(self).await,
        }
    }

    fn tool_label(&self) -> String {
        format!("{}.{}", self.tool.server_id(), self.tool.tool_name())
    }

    fn binding<'b>(&'b self, caller: &'b str) -> CallBinding<'b> {
        CallBinding {
            task: &self.task.name,
            server_id: self.tool.server_id(),
            tool: self.tool.tool_name(),
            arguments: self.arguments,
            record_revision: self.tool.server.revision,
            caller,
        }
    }

    /// The registry's approvals, or the refusal saying this worker has none.
    fn approvals(&self) -> Result<&RegistryApprovals, CallError> {
        self.approvals.ok_or_else(|| CallError::ApprovalRequired {
            message: format!(
                "{} requires an approval, and this worker has no registry to ask",
                self.tool_label()
            ),
            approval_id: None,
        })
    }

    /// Requests an approval of this call from the registry; its id.
    pub async fn request(&self) -> Result<String, CallError> {
        let approvals = self.approvals()?;
        let caller = principal_of(self.caller);
        approvals
            .request(&self.binding(&caller))
            .await
            .map_err(|err| match err.limit_message() {
                // The caller's pending approvals are at the registry's cap:
                // no new one until some are decided or expire.
                Some(message) => CallError::LimitReached(format!(
                    "{} requires an approval, and none can be requested now: {message}",
                    self.tool_label()
                )),
                None => unreachable(err),
            })
    }

    /// The refusal of a call whose approval `id` waits for an approver.
    pub fn waiting_for(&self, id: &str) -> CallError {
        CallError::ApprovalRequired {
            message: format!(
                "{} requires an approval: approval {id} is waiting for an approver; repeat the call with its id once it is approved",
                self.tool_label()
            ),
            approval_id: Some(id.to_owned()),
        }
    }

    /// Uses approval `id` for this call, or says why it cannot be used
    /// (still pending included).
    pub async fn use_id(&self, id: &str) -> Result<Cleared, CallError> {
        let outcome = self.try_use(id).await?;
        refusal(id, outcome).map(|()| Cleared(()))
    }

    /// Tries to use approval `id`: `None` while no approver decided it.
    pub async fn use_if_decided(&self, id: &str) -> Result<Option<Cleared>, CallError> {
        match self.try_use(id).await? {
            UseOutcome::Pending => Ok(None),
            outcome => refusal(id, outcome).map(|()| Some(Cleared(()))),
        }
    }

    /// The approval was used for exactly this call in an earlier round of
    /// the same request, as the request's integrity-protected state says
    /// (`gateway::request_state`: sealed by the fleet's key, bound to
    /// caller, endpoint, tool and arguments): the call runs again with the
    /// client's answers under it.
    pub fn used_in_earlier_round(&self) -> Cleared {
        Cleared(())
    }

    async fn try_use(&self, id: &str) -> Result<UseOutcome, CallError> {
        let approvals = self.approvals()?;
        let caller = principal_of(self.caller);
        approvals
            .use_for(id, &self.binding(&caller))
            .await
            .map_err(unreachable)
    }
}

impl Cleared {
    /// The proof for a tool that needs no approval.
    pub(crate) fn not_needed(tool: &CatalogTool) -> Option<Cleared> {
        (!tool.needs_approval()).then_some(Cleared(()))
    }
}

/// The refusal of approval `id` for what trying to use it came to (`Ok`: it
/// was used, the call may run).
fn refusal(id: &str, outcome: UseOutcome) -> Result<(), CallError> {
    match outcome {
        UseOutcome::Used => Ok(()),
        UseOutcome::Denied => Err(CallError::ApprovalDenied(format!(
            "approval {id} was denied by an approver"
        ))),
        UseOutcome::Mismatch(field) => Err(CallError::ApprovalInvalid(format!(
            "approval {id} was given for another call (its {} differs)",
            field.as_str()
        ))),
        other => Err(CallError::ApprovalInvalid(format!(
            "approval {id} cannot be used: {}",
            other.as_str().replace('_', " ")
        ))),
    }
}

/// The principal the registry records for an approval's caller (empty: the
/// worker's credential stands for it).
pub(crate) fn principal_of(caller: Option<&CallerId>) -> String {
    caller.map(CallerId::principal).unwrap_or_default()
}

/// A registry that cannot answer about approvals.
fn unreachable(err: quiver_sync::SyncError) -> CallError {
    CallError::Mcp(McpError::Unavailable(format!(
        "approvals cannot be checked with the registry: {err}"
    )))
}
