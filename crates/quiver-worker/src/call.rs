//! One tool call under the caller's policy and the server's budgets: the
//! path shared by the direct tool API and the chat tool loop.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_mcp::leases::{SessionKey, SessionKind};
use quiver_mcp::{
    CallOptions, CallOutcome, ContentBlock, ErrorCode, JsonObject, McpError, McpPool,
};
use quiver_model::approval::UseOutcome;
use quiver_model::policy::CompiledSessionFilter;
use quiver_sync::{CallBinding, RegistryApprovals, Snapshot};
use serde::Deserialize;
use serde_json::Value;

use crate::artifacts::{Artifact, ArtifactStore};
use crate::audit::AuditOptions;
use crate::auth::{CallerId, Task};
use crate::catalog::{Catalog, CatalogCache, CatalogTool};
use crate::error::ErrorObject;
use crate::schema::SchemaCache;
use crate::tool_search::{ToolIndex, ToolIndexCache};

/// A request to run one tool.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// Injected name (or `mcp.<server_id>.<tool_name>`).
    pub name: String,
    /// Tool arguments: a JSON object; absent or null means `{}`.
    #[serde(default)]
    pub arguments: Option<Value>,
    /// An approval of exactly this call, for a tool that needs one
    /// (docs/reference.md §13.7).
    #[serde(default)]
    pub approval_id: Option<String>,
}

/// Why a call did not run or did not finish (docs/reference.md §10).
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The name does not resolve to a tool injected for this caller.
    #[error("{0}")]
    PolicyDenied(String),
    /// The tool needs an approval first; `approval_id` names the one
    /// requested for this call, when the tool API asked for it.
    #[error("{message}")]
    ApprovalRequired {
        /// What to do.
        message: String,
        /// The approval to ask an approver for, then to repeat the call with.
        approval_id: Option<String>,
    },
    /// The approval given was denied.
    #[error("{0}")]
    ApprovalDenied(String),
    /// The approval given cannot be used for this call.
    #[error("{0}")]
    ApprovalInvalid(String),
    /// The arguments are not a JSON object.
    #[error("{0}")]
    InvalidArguments(String),
    /// A per-caller limit of the fleet refuses the call (the message names
    /// it), e.g. the caller's pending approvals at the registry's cap.
    #[error("{0}")]
    LimitReached(String),
    /// The MCP call failed.
    #[error(transparent)]
    Mcp(#[from] McpError),
}

impl CallError {
    /// The refusal for a name that is not one of the caller's tools.
    pub fn not_available(name: &str) -> Self {
        CallError::PolicyDenied(format!("{name:?} is not a tool available to this caller"))
    }

    /// The error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            CallError::PolicyDenied(_) => ErrorCode::McpPolicyDenied,
            CallError::ApprovalRequired { .. } => ErrorCode::McpApprovalRequired,
            CallError::ApprovalDenied(_) => ErrorCode::McpApprovalDenied,
            CallError::ApprovalInvalid(_) => ErrorCode::McpApprovalInvalid,
            CallError::InvalidArguments(_) => ErrorCode::McpInvalidArguments,
            CallError::LimitReached(_) => ErrorCode::ResourceExhausted,
            CallError::Mcp(err) => err.code(),
        }
    }

    /// Whether retrying later may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            CallError::LimitReached(_) => true,
            CallError::Mcp(err) => err.retryable(),
            _ => false,
        }
    }

    /// The error body, `{"error": {…}}`.
    pub fn to_json(&self) -> Value {
        ErrorObject::from(self).to_body()
    }
}

impl From<&CallError> for ErrorObject {
    fn from(err: &CallError) -> Self {
        let object = ErrorObject::new(err.code(), err.to_string()).with_retryable(err.retryable());
        match err {
            CallError::ApprovalRequired {
                approval_id: Some(id),
                ..
            } => object.with("approval_id", Value::String(id.clone())),
            _ => object,
        }
    }
}

/// A call that reached the server and got an answer.
#[derive(Debug, Clone)]
pub struct CallDone {
    /// What was called.
    pub tool: CatalogTool,
    /// The answer, output cap applied; its image and audio items replaced
    /// by notes when they went to the artifact store.
    pub outcome: CallOutcome,
    /// What went to the artifact store, in content order.
    pub artifacts: Vec<Artifact>,
    /// Whether the server's content had any non-empty text (before images
    /// and audio became notes): without it, `structuredContent` is what
    /// the model reads.
    pub server_text: bool,
}

impl CallDone {
    /// Whether the server flagged its result as an error (`isError`).
    pub fn is_error(&self) -> bool {
        self.outcome.result.is_error == Some(true)
    }

    /// The §10 error object the answer also carries: `mcp_tool_error` for an
    /// `isError` result (its text kept), `mcp_output_too_large` when the
    /// output was truncated; `None` for a clean success.
    pub fn error_object(&self) -> Option<Value> {
        if self.is_error() {
            let text: Vec<&str> = self
                .outcome
                .result
                .content
                .iter()
                .filter_map(|c| match c {
                    ContentBlock::Text(t) => Some(t.text.as_str()),
                    _ => None,
                })
                .collect();
            return Some(ErrorObject::new(ErrorCode::McpToolError, text.join("\n")).to_value());
        }
        let output = self.outcome.output;
        output.truncated().then(|| {
            ErrorObject::new(
                ErrorCode::McpOutputTooLarge,
                format!(
                    "output truncated to {} of {} bytes",
                    output.kept, output.original
                ),
            )
            .to_value()
        })
    }
}

/// A call's arguments as an object: absent is empty, a JSON string (as
/// models write them) is parsed.
pub fn arguments_object(arguments: Option<Value>) -> Result<JsonObject, CallError> {
    match arguments {
        None | Some(Value::Null) => Ok(JsonObject::new()),
        Some(Value::Object(map)) => Ok(map),
        // Models sometimes send the arguments as a JSON string.
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Err(CallError::InvalidArguments(
                "arguments must be a JSON object".into(),
            )),
            Err(err) => Err(CallError::InvalidArguments(format!(
                "arguments are not valid JSON: {err}"
            ))),
        },
        Some(_) => Err(CallError::InvalidArguments(
            "arguments must be a JSON object".into(),
        )),
    }
}

/// What an approval of a call is bound to.
fn binding<'a>(
    task: &'a Task,
    caller: &'a str,
    tool: &'a CatalogTool,
    arguments: &'a Value,
) -> CallBinding<'a> {
    CallBinding {
        task: &task.name,
        server_id: tool.server_id(),
        tool: tool.tool_name(),
        arguments,
        record_revision: tool.server.revision,
        caller,
    }
}

/// The refusal of approval `id` for what trying to use it came to (`Ok`:
/// it was used, the call may run).
pub fn approval_refusal(id: &str, outcome: UseOutcome) -> Result<(), CallError> {
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
fn principal_of(caller: Option<&CallerId>) -> String {
    caller.map(CallerId::principal).unwrap_or_default()
}

/// A registry that cannot answer about approvals.
fn unreachable(err: quiver_sync::SyncError) -> CallError {
    CallError::Mcp(McpError::Unavailable(format!(
        "approvals cannot be checked with the registry: {err}"
    )))
}

/// Who a call is made for, for the audit log.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    /// The worker's id of the HTTP request (`x-request-id`).
    pub request_id: String,
    /// The caller's session, when it named one.
    pub session_id: Option<String>,
    /// The caller's `_meta` and, for an MCP client, where the server's
    /// traffic about the call goes (see `quiver_mcp::relay`).
    pub relay: CallOptions,
    /// The caller whose artifact store gets the result's images and audio
    /// (tool API, chat); `None` keeps them inline within the per-item
    /// limit (gateway clients).
    pub artifacts_owner: Option<CallerId>,
    /// The caller presenting the request: the owner of its session's
    /// per-session connections. Without one the call has no session.
    pub caller: Option<CallerId>,
    /// Which namespace `session_id` is in: a name the caller chose
    /// (`x-quiver-session`) or a gateway MCP session.
    pub session_kind: SessionKind,
}

impl CallContext {
    /// The caller's session as per-session connections are keyed: the
    /// caller's own (another caller naming the same id has another
    /// session), of its task, and apart from gateway sessions.
    pub fn session_key(&self, task: &Task) -> Option<SessionKey> {
        let caller = self.caller.as_ref()?;
        self.session_id.as_ref().map(|id| SessionKey {
            caller: caller.principal(),
            task: task.name.clone(),
            kind: self.session_kind,
            session_id: id.clone(),
        })
    }
}

/// Runs tools for callers: schema check, pool call, metrics and audit. One
/// runner serves the direct tool API and the chat tool loop.
#[derive(Clone)]
pub struct ToolRunner {
    pool: McpPool,
    catalogs: Arc<CatalogCache>,
    catalog_wait: Duration,
    /// Search indexes of the catalogs requests used (tool search).
    indexes: Arc<ToolIndexCache>,
    schemas: Arc<SchemaCache>,
    audit: Arc<AuditOptions>,
    /// The registry's approvals, for tool API calls of tools that need one.
    approvals: Option<RegistryApprovals>,
    /// Images and audio of results.
    artifacts: Arc<ArtifactStore>,
}

impl ToolRunner {
    /// A runner over `pool`; catalogs of several servers wait at most
    /// `catalog_wait` for any one server's tool list (see [`Catalog::build`]).
    pub fn new(pool: McpPool, audit: AuditOptions, catalog_wait: Duration) -> Self {
        ToolRunner {
            pool,
            catalogs: Arc::default(),
            catalog_wait,
            indexes: Arc::default(),
            schemas: Arc::default(),
            audit: Arc::new(audit),
            approvals: None,
            artifacts: Arc::default(),
        }
    }

    /// Keeps the images and audio of results in `artifacts`.
    pub fn with_artifacts(mut self, artifacts: Arc<ArtifactStore>) -> Self {
        self.artifacts = artifacts;
        self
    }

    /// The artifact store.
    pub fn artifacts(&self) -> &Arc<ArtifactStore> {
        &self.artifacts
    }

    /// Asks `approvals` for the approvals of tool API calls.
    pub fn with_approvals(mut self, approvals: RegistryApprovals) -> Self {
        self.approvals = Some(approvals);
        self
    }

    /// The MCP pool.
    pub fn pool(&self) -> &McpPool {
        &self.pool
    }

    /// The tools `task` (narrowed by `session`, restricted to `only`) may
    /// use now; see [`Catalog::build`]. Resolving a call (`only` given)
    /// waits for its server at most the server's `tool_timeout_ms` (the call
    /// then gets what is left of it); a listing of several servers waits at
    /// most `catalog_wait` for each.
    pub async fn catalog(
        &self,
        snapshot: &Snapshot,
        task: &Task,
        session: Option<&CompiledSessionFilter>,
        only: Option<&BTreeSet<String>>,
    ) -> Catalog {
        Catalog::build(
            snapshot,
            &self.pool,
            &self.catalogs,
            &task.policy,
            session,
            only,
            Some(self.catalog_wait_for(snapshot, only)),
        )
        .await
    }

    /// The search index of `catalog`, built once per catalog contents.
    pub fn tool_index(&self, catalog: &Catalog) -> Arc<ToolIndex> {
        self.indexes.get_or_build(catalog)
    }

    /// How long a catalog restricted to `only` waits for a server's tools.
    fn catalog_wait_for(&self, snapshot: &Snapshot, only: Option<&BTreeSet<String>>) -> Duration {
        only.and_then(|ids| {
            ids.iter()
                .filter_map(|id| snapshot.servers.get(id))
                .map(|server| Duration::from_millis(server.spec.budgets.tool_timeout_ms))
                .max()
        })
        .unwrap_or(self.catalog_wait)
    }

    /// Resolves `request.name` against what `task` may use and runs it.
    pub async fn call(
        &self,
        snapshot: &Snapshot,
        task: &Task,
        context: &CallContext,
        request: &ToolCall,
    ) -> Result<CallDone, CallError> {
        let started = Instant::now();
        let tool = self.resolve(snapshot, task, &request.name).await?;
        if tool.needs_approval() {
            self.approve(task, context.caller.clone(), &tool, request)
                .await?;
            return self
                .execute(task, context, &tool, request.arguments.clone(), started)
                .await;
        }
        self.run(task, context, &tool, request.arguments.clone(), started)
            .await
    }

    /// An approval of exactly this call (§13.7): without `approval_id` one
    /// is requested from the registry and the call refused with its id;
    /// with it, the approval is used (once, across every worker) or the
    /// call refused saying why.
    async fn approve(
        &self,
        task: &Task,
        caller: Option<CallerId>,
        tool: &CatalogTool,
        request: &ToolCall,
    ) -> Result<(), CallError> {
        match &request.approval_id {
            Some(id) => {
                self.use_approval(task, caller, tool, request.arguments.clone(), id)
                    .await
            }
            None => Err(self
                .request_approval(task, caller, tool, request.arguments.clone())
                .await?),
        }
    }

    /// The registry's approvals, or the refusal saying this worker has none.
    fn approvals(&self, tool: &CatalogTool) -> Result<&RegistryApprovals, CallError> {
        self.approvals
            .as_ref()
            .ok_or_else(|| CallError::ApprovalRequired {
                message: format!(
                    "{}.{} requires an approval, and this worker has no registry to ask",
                    tool.server_id(),
                    tool.tool_name()
                ),
                approval_id: None,
            })
    }

    /// Requests an approval of this call; returns the refusal that carries
    /// its id (or why none could be requested).
    pub async fn request_approval(
        &self,
        task: &Task,
        caller: Option<CallerId>,
        tool: &CatalogTool,
        arguments: Option<Value>,
    ) -> Result<CallError, CallError> {
        let approvals = self.approvals(tool)?;
        let arguments = Value::Object(arguments_object(arguments)?);
        let caller = principal_of(caller.as_ref());
        let id = approvals
            .request(&binding(task, &caller, tool, &arguments))
            .await
            .map_err(|err| match err.limit_message() {
                // The caller's pending approvals are at the registry's cap:
                // no new one until some are decided or expire.
                Some(message) => CallError::LimitReached(format!(
                    "{}.{} requires an approval, and none can be requested now: {message}",
                    tool.server_id(),
                    tool.tool_name()
                )),
                None => unreachable(err),
            })?;
        Ok(CallError::ApprovalRequired {
            message: format!(
                "{}.{} requires an approval: approval {id} is waiting for an approver; repeat the call with its id once it is approved",
                tool.server_id(),
                tool.tool_name()
            ),
            approval_id: Some(id),
        })
    }

    /// Uses approval `id` for this call: `Ok` means it may run, once.
    pub async fn use_approval(
        &self,
        task: &Task,
        caller: Option<CallerId>,
        tool: &CatalogTool,
        arguments: Option<Value>,
        id: &str,
    ) -> Result<(), CallError> {
        let outcome = self
            .approval_outcome(task, caller, tool, arguments, id)
            .await?;
        approval_refusal(id, outcome)
    }

    /// Tries to use approval `id` for this call and says what came of it
    /// (`Used`: it may run, once; `Pending`: no approver decided yet).
    pub async fn approval_outcome(
        &self,
        task: &Task,
        caller: Option<CallerId>,
        tool: &CatalogTool,
        arguments: Option<Value>,
        id: &str,
    ) -> Result<UseOutcome, CallError> {
        let approvals = self.approvals(tool)?;
        let arguments = Value::Object(arguments_object(arguments)?);
        let caller = principal_of(caller.as_ref());
        approvals
            .use_for(id, &binding(task, &caller, tool, &arguments))
            .await
            .map_err(unreachable)
    }

    /// The tool `name` refers to among those `task` may use.
    async fn resolve(
        &self,
        snapshot: &Snapshot,
        task: &Task,
        name: &str,
    ) -> Result<CatalogTool, CallError> {
        let candidates = Catalog::candidate_servers(name);
        if candidates.is_empty() {
            return Err(CallError::not_available(name));
        }
        let catalog = self.catalog(snapshot, task, None, Some(&candidates)).await;
        match catalog.resolve(name) {
            Some(tool) => Ok(tool.clone()),
            // A selected server that cannot list its tools is unavailable,
            // not a policy refusal.
            None => match catalog.unavailable.first() {
                Some(down) => Err(CallError::Mcp(down.error.clone())),
                None => Err(CallError::not_available(name)),
            },
        }
    }

    /// Runs a tool already resolved against the caller's catalog. `started`
    /// is when the caller's request for it arrived (latency metric): the
    /// server's `tool_timeout_ms` counts from then.
    pub async fn run(
        &self,
        task: &Task,
        context: &CallContext,
        tool: &CatalogTool,
        arguments: Option<Value>,
        started: Instant,
    ) -> Result<CallDone, CallError> {
        if tool.needs_approval() {
            return Err(CallError::ApprovalRequired {
                message: format!(
                    "{}.{} requires an approval before it runs (through the tool API, POST /v1/mcp/tools/call)",
                    tool.server_id(),
                    tool.tool_name()
                ),
                approval_id: None,
            });
        }
        self.execute(task, context, tool, arguments, started).await
    }

    /// Runs a tool whose approval, if it needs one, is settled.
    pub async fn execute(
        &self,
        task: &Task,
        context: &CallContext,
        tool: &CatalogTool,
        arguments: Option<Value>,
        started: Instant,
    ) -> Result<CallDone, CallError> {
        let arguments = arguments_object(arguments)?;
        self.schemas
            .check(&tool.tool.input_schema, &arguments)
            .map_err(CallError::InvalidArguments)?;
        let logged_arguments = self.audit.arguments(&arguments);
        let result = self
            .pool
            .call_tool_with(
                &tool.server,
                tool.tool_name(),
                Some(arguments),
                started,
                CallOptions {
                    session: context.session_key(task),
                    ..context.relay.clone()
                },
            )
            .await;
        let (server_id, tool_name) = (tool.server_id().to_owned(), tool.tool_name().to_owned());
        let status = match &result {
            Ok(outcome) if outcome.result.is_error == Some(true) => {
                ErrorCode::McpToolError.as_str()
            }
            Ok(outcome) if outcome.output.truncated() => ErrorCode::McpOutputTooLarge.as_str(),
            Ok(_) => "ok",
            Err(err) => err.code().as_str(),
        };
        let duration = started.elapsed();
        metrics::counter!("mcp_tool_call_total", "server_id" => server_id.clone(), "tool" => tool_name.clone()).increment(1);
        // Who called, by policy (a bounded set), never by principal.
        metrics::counter!("quiver_worker_calls_by_policy_total", "policy" => task.name.clone(), "status" => status)
            .increment(1);
        metrics::histogram!("mcp_tool_call_latency_ms", "server_id" => server_id.clone(), "tool" => tool_name.clone())
            .record(duration.as_secs_f64() * 1000.0);
        if status != "ok" {
            metrics::counter!("mcp_tool_call_error_total", "server_id" => server_id.clone(), "tool" => tool_name.clone(), "code" => status)
                .increment(1);
        }
        tracing::info!(
            target: "quiver::audit",
            request_id = %context.request_id,
            session_id = context.session_id.as_deref().unwrap_or(""),
            principal = %principal_of(context.caller.as_ref()),
            task = %task.name,
            server_id = %server_id,
            tool = %tool_name,
            status,
            duration_ms = duration.as_millis() as u64,
            arguments = %logged_arguments,
            "mcp tool call"
        );
        let mut outcome = result?;
        let server_text =
            outcome.result.content.iter().any(
                |item| matches!(item, ContentBlock::Text(text) if !text.text.trim().is_empty()),
            );
        let artifacts = match context.artifacts_owner.clone() {
            Some(owner) => self.artifacts.take_from(owner, &mut outcome.result),
            None => {
                self.artifacts.limit_inline(&mut outcome.result);
                Vec::new()
            }
        };
        Ok(CallDone {
            tool: tool.clone(),
            outcome,
            artifacts,
            server_text,
        })
    }
}
