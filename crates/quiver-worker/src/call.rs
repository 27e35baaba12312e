//! One tool call under the caller's policy, its approval and the server's
//! budgets: the one path of the tool API, the chat tool loop and the
//! gateway ([`ToolRunner::call`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_mcp::leases::SessionKind;
use quiver_mcp::relay::CallPeer;
use quiver_mcp::{
    CallOptions, CallOutcome, ContentBlock, JsonObject, McpError, McpPool, UpstreamInput,
};
use quiver_model::ErrorCode;
use quiver_model::policy::CompiledSessionFilter;
use quiver_sync::{RegistryApprovals, Snapshot};
use rmcp::model::{InputRequest, InputRequiredResult, InputResponses};
use serde_json::Value;

use crate::approval::{ApprovalFlow, Cleared, Pending, principal_of};
use crate::artifacts::{Artifact, ArtifactStore};
use crate::audit::AuditOptions;
use crate::auth::{CallerId, Task};
pub use crate::call_error::CallError;
use crate::catalog::{Catalog, CatalogCache, CatalogTool, Listing};
use crate::error::ErrorObject;
use crate::quota::{Admission, Quotas};
use crate::schema::SchemaCache;
use crate::tool_search::{ToolIndex, ToolIndexCache};
use crate::usage::{CallSubject, CallUsage, UsageRecorder};

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

/// Who a call is made for, for the audit log, and where what its server
/// sends about it goes.
#[derive(Clone, Default)]
pub struct CallContext {
    /// The worker's id of the HTTP request (`x-request-id`).
    pub request_id: String,
    /// The caller's `_meta`, its session's key (built once, by
    /// [`CallContext::new`] or the gateway's edge) and, for an MCP client,
    /// where the server's traffic about the call goes (see
    /// `quiver_mcp::relay`).
    pub relay: CallOptions,
    /// The caller whose artifact store gets the result's images and audio
    /// (tool API, chat); `None` keeps them inline within the per-item
    /// limit (gateway clients).
    pub artifacts_owner: Option<CallerId>,
    /// The caller presenting the request: the principal of its approvals
    /// and audit lines.
    pub caller: Option<CallerId>,
    /// Who answers when a server of 2026-07-28 asks by `input_required`
    /// during the call: a gateway session's client, asked by requests on
    /// its session. `None`: the call ends in [`McpError::InputRequired`]
    /// for the caller to answer itself.
    pub input_from: Option<Arc<dyn CallPeer>>,
}

impl CallContext {
    /// A call by `caller` under `task`, in its session (`kind`, id) when it
    /// named one.
    pub fn new(
        request_id: String,
        caller: CallerId,
        task: &Task,
        session: Option<(SessionKind, String)>,
    ) -> Self {
        CallContext {
            request_id,
            relay: CallOptions {
                session: session.map(|(kind, id)| caller.session(task, kind, id)),
                principal: caller.grant_principal(),
                ..Default::default()
            },
            caller: Some(caller),
            ..Default::default()
        }
    }

    /// The result's images and audio go to the caller's artifact store.
    pub fn keeping_artifacts(mut self) -> Self {
        self.artifacts_owner = self.caller.clone();
        self
    }

    /// The session id the caller named, for audit lines.
    pub fn session_id(&self) -> &str {
        self.relay
            .session
            .as_ref()
            .map_or("", |session| session.session_id.as_str())
    }
}

/// Where a call's name is looked up among the caller's tools.
#[derive(Clone, Copy)]
pub enum Lookup<'a> {
    /// An injected name (or `mcp.<server_id>.<tool_name>`) among the tools
    /// the caller may use, narrowed by `session` when given (tool API,
    /// `/mcp`).
    Injected {
        /// The registry's records.
        snapshot: &'a Snapshot,
        /// The request's narrowing of the caller's policy.
        session: Option<&'a CompiledSessionFilter>,
    },
    /// A tool's own name at one server (`/mcp/{server_id}`).
    OwnName {
        /// The registry's records.
        snapshot: &'a Snapshot,
        /// The server.
        server_id: &'a str,
    },
    /// An injected name in the catalog the request already built (chat).
    In(&'a Catalog),
}

/// One call: which tool, with what, approved how.
pub struct Call<'a> {
    /// The name, looked up by `lookup`.
    pub name: &'a str,
    /// The arguments: an object; absent or null means `{}`.
    pub arguments: Option<Value>,
    /// Where the name is looked up.
    pub lookup: Lookup<'a>,
    /// How a tool that needs an approval gets it.
    pub approval: ApprovalFlow<'a>,
}

/// Rounds a session's client is asked for a server of 2026-07-28 that asks
/// by `input_required`, before the call gives up (each within the call's
/// `tool_timeout_ms` all the same).
const MAX_ASKED_ROUNDS: usize = 8;

/// Asks `peer` what a server of 2026-07-28 asked by `input_required`, one
/// request at a time; the answers to send back, or `None` when it did not
/// answer one.
async fn answer_by_asking(
    peer: &dyn CallPeer,
    asked: &InputRequiredResult,
) -> Option<UpstreamInput> {
    let mut responses = InputResponses::new();
    for (key, request) in asked.input_requests.iter().flatten() {
        let answer = match request {
            InputRequest::Elicitation(request) => peer
                .create_elicitation(request.params.clone())
                .await
                .map(|answer| serde_json::to_value(answer).ok()),
            InputRequest::CreateMessage(request) => peer
                .create_message(request.params.clone())
                .await
                .map(|answer| serde_json::to_value(answer).ok()),
            InputRequest::ListRoots(_) => peer
                .list_roots(None)
                .await
                .map(|answer| serde_json::to_value(answer).ok()),
            _ => return None,
        };
        responses.insert(key.clone(), answer.ok().flatten()?);
    }
    Some(UpstreamInput {
        responses,
        request_state: asked.request_state.clone(),
    })
}

/// Runs tools for callers: name lookup, approval, schema check, pool call,
/// metrics and audit. Every surface (tool API, chat tool loop, gateway)
/// calls tools through [`ToolRunner::call`] and nothing else.
#[derive(Clone)]
pub struct ToolRunner {
    pool: McpPool,
    catalogs: Arc<CatalogCache>,
    catalog_wait: Duration,
    /// Search indexes of the catalogs requests used (tool search).
    indexes: Arc<ToolIndexCache>,
    schemas: Arc<SchemaCache>,
    audit: Arc<AuditOptions>,
    /// The registry's approvals, for calls of tools that need one.
    approvals: Option<RegistryApprovals>,
    /// Images and audio of results.
    artifacts: Arc<ArtifactStore>,
    /// Policies' rate limits and concurrency caps.
    quotas: Arc<Quotas>,
    /// Where each call is counted for the registry's usage report.
    usage: Option<Arc<UsageRecorder>>,
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
            quotas: Arc::default(),
            usage: None,
        }
    }

    /// Counts rate limits with `quotas` (fleet-wide when it has a registry).
    pub fn with_quotas(mut self, quotas: Arc<Quotas>) -> Self {
        self.quotas = quotas;
        self
    }

    /// Counts every call in `usage`.
    pub fn with_usage(mut self, usage: Arc<UsageRecorder>) -> Self {
        self.usage = Some(usage);
        self
    }

    /// The rate limits and concurrency caps.
    pub fn quotas(&self) -> &Arc<Quotas> {
        &self.quotas
    }

    /// The usage recorder, when calls are counted.
    pub fn usage(&self) -> Option<&Arc<UsageRecorder>> {
        self.usage.as_ref()
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

    /// Asks `approvals` for the approvals of calls.
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
        caller: Option<&CallerId>,
        session: Option<&CompiledSessionFilter>,
        only: Option<&BTreeSet<String>>,
    ) -> Catalog {
        let principal = caller.and_then(CallerId::grant_principal);
        let listing = Listing {
            pool: &self.pool,
            principal: principal.as_deref(),
            wait: Some(self.catalog_wait_for(snapshot, only)),
        };
        Catalog::build(
            snapshot,
            listing,
            &self.catalogs,
            &task.policy,
            session,
            only,
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

    /// An approval of a call of `tool` with `arguments` by `caller`,
    /// requested ahead of the call (chat asks for every call of a turn
    /// before any runs); its id.
    pub async fn request_approval(
        &self,
        task: &Task,
        caller: Option<&CallerId>,
        tool: &CatalogTool,
        arguments: Option<Value>,
    ) -> Result<String, CallError> {
        let arguments = Value::Object(arguments_object(arguments)?);
        self.pending(task, caller, tool, &arguments).request().await
    }

    fn pending<'a>(
        &'a self,
        task: &'a Task,
        caller: Option<&'a CallerId>,
        tool: &'a CatalogTool,
        arguments: &'a Value,
    ) -> Pending<'a> {
        Pending {
            approvals: self.approvals.as_ref(),
            task,
            caller,
            tool,
            arguments,
        }
    }

    /// Looks `call.name` up, settles its approval by `call.approval` and
    /// runs it: the one way a tool runs.
    pub async fn call(
        &self,
        task: &Task,
        context: &CallContext,
        call: Call<'_>,
    ) -> Result<CallDone, CallError> {
        let started = Instant::now();
        let tool = self
            .resolve(task, context.caller.as_ref(), call.lookup, call.name)
            .await?;
        let arguments = arguments_object(call.arguments)?;
        let cleared = match Cleared::not_needed(&tool) {
            Some(cleared) => cleared,
            None => {
                let bound = Value::Object(arguments.clone());
                // Boxed, as the other paths off the common one are: what
                // an approval may wait on would otherwise add its size to
                // every call's future.
                Box::pin(
                    self.pending(task, context.caller.as_ref(), &tool, &bound)
                        .settle(call.approval),
                )
                .await?
            }
        };
        // Boxed: the call on the wire is most of this future's size, and
        // every caller's future (each surface's handler, the gateway's
        // round) would otherwise hold it inline and be moved whole on its
        // way to the runtime (BENCHMARKS.md "Work per call, counted").
        Box::pin(self.execute(task, context, tool, arguments, cleared, started)).await
    }

    /// The tool `name` refers to, looked up by `lookup`, among those `task`
    /// may use.
    async fn resolve(
        &self,
        task: &Task,
        caller: Option<&CallerId>,
        lookup: Lookup<'_>,
        name: &str,
    ) -> Result<CatalogTool, CallError> {
        let catalog = match lookup {
            Lookup::In(catalog) => {
                return catalog
                    .resolve(name)
                    .cloned()
                    .ok_or_else(|| CallError::not_available(name));
            }
            Lookup::Injected { snapshot, session } => {
                let candidates = Catalog::candidate_servers(name);
                if candidates.is_empty() {
                    return Err(CallError::not_available(name));
                }
                let catalog = self
                    .catalog(snapshot, task, caller, session, Some(&candidates))
                    .await;
                if let Some(tool) = catalog.resolve(name) {
                    return Ok(tool.clone());
                }
                catalog
            }
            Lookup::OwnName {
                snapshot,
                server_id,
            } => {
                let only = BTreeSet::from([server_id.to_owned()]);
                let catalog = self
                    .catalog(snapshot, task, caller, None, Some(&only))
                    .await;
                if let Some(tool) = catalog.own_named().find(|tool| tool.exposed_name == name) {
                    return Ok(tool.clone());
                }
                catalog
            }
        };
        // A selected server that cannot list its tools is unavailable, not
        // a policy refusal.
        match catalog.unavailable.first() {
            Some(down) => Err(CallError::Mcp(down.error.clone())),
            None => Err(CallError::not_available(name)),
        }
    }

    /// Admits a call under the caller's policy's rate limits and
    /// concurrency cap; a refusal is counted, logged and answered with the
    /// rule that refused.
    async fn admit(
        &self,
        task: &Task,
        context: &CallContext,
        subject: CallSubject<'_>,
    ) -> Result<Admission, CallError> {
        let policy = &task.policy;
        if policy.rate_limits().is_empty() && policy.max_concurrent_calls().is_none() {
            return Ok(Admission::unlimited());
        }
        let refusal = match self
            .quotas
            .admit(
                subject.policy,
                subject.principal,
                policy.rate_limits(),
                policy.max_concurrent_calls(),
                (subject.server_id, subject.tool),
            )
            .await
        {
            Ok(admission) => return Ok(admission),
            Err(refusal) => refusal,
        };
        metrics::counter!("quiver_worker_calls_by_policy_total", "policy" => task.name.clone(), "status" => ErrorCode::McpRateLimited.as_str())
            .increment(1);
        tracing::info!(
            target: "quiver::audit",
            request_id = %context.request_id,
            session_id = context.session_id(),
            principal = %subject.principal,
            task = %task.name,
            server_id = %subject.server_id,
            tool = %subject.tool,
            status = ErrorCode::McpRateLimited.as_str(),
            reason = %refusal.message,
            "mcp tool call refused"
        );
        if let Some(usage) = &self.usage {
            usage.record(subject, CallUsage::RateLimited);
        }
        Err(CallError::RateLimited {
            message: refusal.message,
            retry_after: refusal.retry_after,
        })
    }

    /// Runs a tool resolved against the caller's catalog, its approval
    /// settled (`_cleared`). `started` is when the caller's request for it
    /// arrived (latency metric): the server's `tool_timeout_ms` counts from
    /// then.
    async fn execute(
        &self,
        task: &Task,
        context: &CallContext,
        tool: CatalogTool,
        arguments: JsonObject,
        _cleared: Cleared,
        started: Instant,
    ) -> Result<CallDone, CallError> {
        self.schemas
            .check(&tool.tool.input_schema, &arguments)
            .map_err(CallError::InvalidArguments)?;
        let principal = principal_of(context.caller.as_ref());
        let subject = CallSubject {
            principal: &principal,
            policy: &task.name,
            server_id: tool.server_id(),
            tool: tool.tool_name(),
        };
        // Boxed: the lease it may ask the registry for is a large future,
        // and every surface's call path (the gateway's deepest) holds this
        // one's state on its stack otherwise.
        let _admission = Box::pin(self.admit(task, context, subject)).await?;
        let logged_arguments = self.audit.arguments(&arguments);
        let mut options = context.relay.clone();
        let mut asked_rounds = 0;
        let result = loop {
            let result = self
                .pool
                .call_tool_with(
                    &tool.server,
                    tool.tool_name(),
                    Some(arguments.clone()),
                    started,
                    options.clone(),
                )
                .await;
            // A server of 2026-07-28 asked by `input_required`: a session's
            // client is asked here and the call repeated with its answers.
            let (Err(McpError::InputRequired(asked)), Some(peer)) = (&result, &context.input_from)
            else {
                break result;
            };
            if asked_rounds == MAX_ASKED_ROUNDS {
                break result;
            }
            asked_rounds += 1;
            match Box::pin(answer_by_asking(peer.as_ref(), asked)).await {
                Some(input) => options.input = Some(input),
                None => break result,
            }
        };
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
        if let Some(usage) = &self.usage {
            let failed = match &result {
                Ok(outcome) => outcome.result.is_error == Some(true),
                Err(_) => true,
            };
            usage.record(
                CallSubject {
                    principal: &principal,
                    policy: &task.name,
                    server_id: &server_id,
                    tool: &tool_name,
                },
                CallUsage::Ran {
                    failed,
                    latency: duration,
                },
            );
        }
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
            session_id = context.session_id(),
            principal = %principal,
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
            tool,
            outcome,
            artifacts,
            server_text,
        })
    }
}
