//! `tools/list` and `tools/call` at the gateway: the caller's catalog as
//! the endpoint names it (`/mcp/{id}`: the server's own names; `/mcp`:
//! injected names), and every call through
//! [`ToolRunner::call`](crate::call::ToolRunner::call).

use std::collections::BTreeSet;
use std::sync::Arc;

use quiver_mcp::CallOptions;
use quiver_mcp::McpError;
use quiver_mcp::relay::CallPeer;
use quiver_model::StoredServer;
use quiver_model::policy::{CompiledSessionFilter, SessionFilter, check_session_within_task};
use quiver_sync::Snapshot;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, Tool,
};
use rmcp::service::Peer;

use crate::approval::ApprovalFlow;
use crate::call::{Call, CallContext, CallError, Lookup};
use crate::catalog::{Catalog, CatalogTool};
use crate::gateway::approval::{APPROVAL_META, AskInProtocol};
use crate::gateway::consent;
use crate::gateway::round::{Carried, Round, Settled, in_round};
use crate::gateway::scope::Scope;
use crate::gateway::server::{Completed, GatewayRequest, GatewayServer, Invocation};

impl GatewayServer {
    /// The servers a `tools/call` of `name` at `scope` may be of.
    fn candidates(snapshot: &Snapshot, scope: &Scope, name: &str) -> Vec<Arc<StoredServer>> {
        let ids = match scope {
            Scope::Server(id) => BTreeSet::from([id.clone()]),
            Scope::Catalog { .. } => Catalog::candidate_servers(name),
        };
        ids.iter()
            .filter_map(|id| snapshot.get(id).cloned())
            .collect()
    }

    /// The caller's tools at this endpoint.
    async fn catalog(&self, request: &GatewayRequest) -> Result<Catalog, ErrorData> {
        let snapshot = self.snapshot();
        let runner = &self.shared.runner;
        match &request.scope {
            Scope::Server(id) => {
                self.server(request, id)?;
                let only = BTreeSet::from([id.clone()]);
                Ok(runner
                    .catalog(
                        &snapshot,
                        &request.task,
                        Some(&request.caller),
                        None,
                        Some(&only),
                    )
                    .await)
            }
            Scope::Catalog { server_ids } => {
                let session = Self::narrowing(request, server_ids.as_ref())?;
                Ok(runner
                    .catalog(
                        &snapshot,
                        &request.task,
                        Some(&request.caller),
                        Some(&session),
                        None,
                    )
                    .await)
            }
        }
    }

    /// The catalog endpoint's `server_ids`, as a narrowing of the caller's
    /// policy.
    fn narrowing(
        request: &GatewayRequest,
        server_ids: Option<&BTreeSet<String>>,
    ) -> Result<CompiledSessionFilter, ErrorData> {
        let session = SessionFilter {
            server_ids: server_ids.map(|ids| ids.iter().cloned().collect()),
            ..Default::default()
        }
        .compile()
        .map_err(|err| ErrorData::invalid_params(err.to_string(), None))?;
        check_session_within_task(&request.task.policy, &session)
            .map_err(|err| ErrorData::invalid_params(err.to_string(), None))?;
        Ok(session)
    }

    /// A catalog tool as the client sees it.
    fn listed(scope: &Scope, tool: &CatalogTool) -> Tool {
        let mut listed = tool.tool.clone();
        match scope {
            Scope::Server(_) => listed.name = tool.exposed_name.clone().into(),
            Scope::Catalog { .. } => {
                let readable = listed
                    .title
                    .clone()
                    .unwrap_or_else(|| tool.exposed_name.clone());
                listed.name = tool.injected_name.clone().into();
                listed.title = Some(format!("{} · {readable}", tool.server_id()));
            }
        }
        listed
    }

    /// `tools/list`: the caller's tools as this endpoint names them.
    pub(super) async fn list(
        &self,
        request: &GatewayRequest,
    ) -> Result<ListToolsResult, ErrorData> {
        let catalog = self.catalog(request).await?;
        let listed = match &request.scope {
            Scope::Server(_) => catalog
                .own_named()
                .map(|tool| Self::listed(&request.scope, tool))
                .collect(),
            Scope::Catalog { .. } => catalog
                .tools()
                .map(|tool| Self::listed(&request.scope, tool))
                .collect(),
        };
        Ok(ListToolsResult::with_all_items(listed))
    }

    /// `tools/call`: the call runs through
    /// [`ToolRunner::call`](crate::call::ToolRunner::call) (the only
    /// way a tool runs), its approval asked in the protocol the client
    /// speaks; what the server sends or asks meanwhile reaches the client
    /// on its session or, without one, in the round's `input_required`.
    pub async fn call(
        &self,
        request: &GatewayRequest,
        params: CallToolRequestParams,
        invocation: &Invocation<'_>,
    ) -> Result<CallToolResponse, ErrorData> {
        let snapshot = self.snapshot();
        let narrowing;
        let lookup = match &request.scope {
            Scope::Server(id) => {
                self.server(request, id)?;
                Lookup::OwnName {
                    snapshot: &snapshot,
                    server_id: id,
                }
            }
            Scope::Catalog { server_ids } => {
                narrowing = Self::narrowing(request, server_ids.as_ref())?;
                Lookup::Injected {
                    snapshot: &snapshot,
                    session: Some(&narrowing),
                }
            }
        };
        // What of the request's `_meta` is passed on upstream: not the
        // worker's own key.
        let mut meta = invocation.meta.forwarded.clone();
        let named_approval = meta
            .as_mut()
            .and_then(|meta| meta.0.0.remove(APPROVAL_META))
            .and_then(|id| id.as_str().map(str::to_owned));
        let arguments = params.arguments.map(serde_json::Value::Object);
        let carried = Carried {
            responses: params.input_responses,
            state: params.request_state,
        };
        let key = self.round_key(
            request,
            "tools/call",
            &params.name,
            arguments.clone().unwrap_or(serde_json::Value::Null),
        );
        let round = self.round(invocation, key, carried)?;
        let (downstream, attachment) = self
            .attachment(invocation, round.as_ref())
            .map_or((None, None), |(peer, attachment)| {
                (Some(peer), Some(attachment))
            });
        // A server of 2026-07-28 is told what this client can be asked.
        let client_capabilities = match &round {
            Some(round) => Some(round.capabilities()),
            None => invocation
                .peer()
                .and_then(Peer::peer_info)
                .map(|info| info.capabilities.clone()),
        };
        let call = CallContext {
            request_id: request.request_id.clone(),
            relay: CallOptions {
                meta,
                attachment,
                session: request.session.clone(),
                principal: request.caller.grant_principal(),
                input: round.as_ref().and_then(Round::upstream_input),
                client_capabilities,
            },
            artifacts_owner: None,
            caller: Some(request.caller.clone()),
            // A server of 2026-07-28 that asks by `input_required`: a
            // session's client is asked on its session; a client without
            // one gets the question passed on (below).
            input_from: match &round {
                None => downstream.clone().map(|peer| peer as Arc<dyn CallPeer>),
                Some(_) => None,
            },
        };
        // A session's client that can open links is sent to the caller's
        // consent link before a call that needs it runs.
        if round.is_none()
            && let Some(peer) = invocation.peer()
        {
            let principal = request.caller.grant_principal();
            for server in Self::candidates(&snapshot, &request.scope, &params.name) {
                // Boxed: rarely more than a look at the client's
                // capabilities, it would otherwise add its whole size to
                // every call's future.
                Box::pin(consent::connect_first(
                    peer,
                    self.shared.runner.pool(),
                    &server,
                    principal.as_deref(),
                ))
                .await;
            }
        }
        let asker = AskInProtocol {
            peer: invocation.peer(),
            named: named_approval,
            round: round.as_ref(),
        };
        // Built in place: the call's future is the largest part of this
        // one, and moving it into `in_round` would store it twice.
        let run = std::pin::pin!(async {
            Ok(self
                .shared
                .runner
                .call(
                    &request.task,
                    &call,
                    Call {
                        name: &params.name,
                        arguments,
                        lookup,
                        approval: ApprovalFlow::Ask(&asker),
                    },
                )
                .await)
        });
        // A client's `notifications/cancelled` fires `ct`: dropping the call
        // cancels it on the server and frees its slot once the server is done.
        let done = tokio::select! {
            done = in_round(round.as_ref(), run) => done?,
            () = invocation.cancelled() => {
                return Err(ErrorData::internal_error("request cancelled by the client", None));
            }
        };
        let done = match done {
            Settled::Done(done) => done,
            Settled::InputRequired(asked) => return Ok(CallToolResponse::InputRequired(asked)),
        };
        match &done {
            // The approval's question.
            Err(CallError::Asking(asked)) => {
                return Ok(CallToolResponse::InputRequired(asked.as_ref().clone()));
            }
            Err(CallError::PolicyDenied(_)) => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool {:?}", params.name),
                    None,
                ));
            }
            // A server of 2026-07-28 asked itself: a client without a
            // session gets its question as it is.
            Err(CallError::Mcp(McpError::InputRequired(asked))) => {
                if let Some(round) = &round {
                    return Ok(CallToolResponse::InputRequired(
                        round.pass_on(asked.as_ref().clone()),
                    ));
                }
            }
            // Without a session: the client that can open links is sent to
            // the caller's consent link; the retry runs with the grant.
            Err(CallError::Mcp(McpError::AuthorizationRequired(required))) => {
                if let Some(round) = round.as_ref().filter(|round| round.may_send_to_link()) {
                    return Ok(CallToolResponse::InputRequired(
                        round.ask_consent(consent::message(required), required.url.clone()),
                    ));
                }
            }
            // A server of 2026-07-28 that refused the call for a capability
            // the client lacks: the client hears it as the server said it.
            Err(CallError::Mcp(McpError::CapabilityRequired(refusal))) => {
                return Err(refusal.as_ref().clone());
            }
            _ => {}
        }
        // A call that failed after its server was refused what the client
        // did not declare failed for want of that capability.
        let failed = done
            .as_ref()
            .map_or(true, |done| done.outcome.result.is_error == Some(true));
        if failed
            && let Some(missing) = round
                .as_ref()
                .and_then(|round| round.inputs.missing_capability())
        {
            return Err(missing);
        }
        // What the server sent about the call reaches the client first.
        if let Some(peer) = &downstream {
            peer.flush().await;
        }
        Ok(match done {
            Ok(done) => done.outcome.result,
            Err(err) => tool_error(&err),
        }
        .completed()
        .into())
    }
}

/// A refused or failed tool call as an MCP tool error: the §10 object as
/// text and as structured content.
fn tool_error(err: &CallError) -> CallToolResult {
    let body = err.to_json();
    let mut result = CallToolResult::error(vec![ContentBlock::text(body.to_string())]);
    result.structured_content = Some(body);
    result
}
