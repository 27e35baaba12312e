//! The MCP server a gateway session talks to: one [`GatewayServer`] per
//! session, answering from the caller's catalog (`/mcp`) or as one server
//! (`/mcp/{server_id}`), under the caller's policy.
//!
//! Every request is judged by what the HTTP edge attached to it (the
//! caller's task, the endpoint, the request id: [`GatewayRequest`]), not by
//! what the session was opened with, so a changed task policy applies at
//! once and a session restored on another worker needs nothing else. Tool
//! calls take the tool API's path ([`ToolRunner::call`]); everything else a
//! server offers is forwarded to it through the pool, filtered by the
//! record's `allowed_resources` / `allowed_prompts`.

// SEP-2577 deprecates logging and resources/subscribe; clients still use both.
#![expect(deprecated)]

mod forward;
mod tools;

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use quiver_mcp::McpError;
use quiver_mcp::leases::SessionKey;
use quiver_mcp::relay::CallAttachment;
use quiver_model::StoredServer;
use quiver_model::naming::{injected_name, parse_injected_name};
use quiver_model::policy::{ServerContentFilter, server_selected};
use quiver_model::resource_uri;
use quiver_sync::Snapshot;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    DiscoverResult, ErrorCode as RpcCode, ErrorData, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, Implementation, InitializeRequestParams, InitializeResult, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    PromptsCapability, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Reference, RequestId, ResourcesCapability, ResultType, ServerCapabilities,
    ServerConfig, ServerResult, SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter,
    ToolsCapability, UnsubscribeRequestParams,
};
use rmcp::service::{Peer, RequestContext, SubscriptionContext};
use rmcp::{RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;

use crate::auth::{CallerId, Task};
use crate::call::ToolRunner;
use crate::gateway::peer::{ClientStream, Downstream, DownstreamPeer, RelaySender};
use crate::gateway::relayed::{
    forward_error, not_found, passed_on, resource_allowed, upstream_params, uri_refused,
};
use crate::gateway::request_meta::RequestMeta;
use crate::gateway::request_state::RequestStates;
use crate::gateway::round::{Carried, Round, RoundKey, Settled, in_round};
use crate::gateway::scope::Scope;
use crate::gateway::sessions::{LiveSession, LiveSessions, RELAY_SLOTS, Registered};

/// What the HTTP edge attaches to each request it passes to the gateway.
#[derive(Debug, Clone)]
pub struct GatewayRequest {
    /// The caller's task.
    pub task: Task,
    /// The caller (the owner of the session's per-session connections).
    pub caller: CallerId,
    /// The endpoint.
    pub scope: Scope,
    /// The worker's id of the HTTP request (`x-request-id`).
    pub request_id: String,
    /// The MCP session (rmcp's id, without the signature), keyed for
    /// per-session connections in the gateway's namespace (a tool API
    /// caller naming this id as `x-quiver-session` has another session);
    /// its id is the audit's session id.
    pub session: Option<SessionKey>,
}

/// What every session of a worker shares.
pub struct Shared {
    /// Runs tools (the tool API's path).
    pub runner: ToolRunner,
    /// The registry snapshot.
    pub snapshot: quiver_sync::SnapshotHandle,
    /// Open sessions, for notifications.
    pub sessions: Arc<LiveSessions>,
    /// Signs the `requestState` of 2026-07-28 requests (fleet-wide key).
    pub states: RequestStates,
}

/// One session's server.
pub struct GatewayServer {
    shared: Arc<Shared>,
    registered: OnceLock<Registered>,
    info: OnceLock<ServerConfig>,
    /// The session's key, once a request named it: its per-session
    /// connections end with the session.
    leases: OnceLock<SessionKey>,
}

impl Drop for GatewayServer {
    /// The session ended (DELETE, idle expiry, shutdown): so do the
    /// connections per-session servers hold for it.
    fn drop(&mut self) {
        if let Some(session) = self.leases.get()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            self.shared.runner.pool().end_session(session);
        }
    }
}

impl GatewayServer {
    /// A server for a new session.
    pub fn new(shared: Arc<Shared>) -> Self {
        GatewayServer {
            shared,
            registered: OnceLock::new(),
            info: OnceLock::new(),
            leases: OnceLock::new(),
        }
    }
}

/// The caching hints (2026-07-28) of what the gateway answers: none of its
/// own, so rmcp's defaults apply (`ttlMs: 0`, `cacheScope: "private"`). A
/// server's own hints are dropped: what a caller sees is filtered for that
/// caller and a registry edit changes it at once.
pub(super) const GATEWAY_CACHE_HINTS: (Option<u64>, Option<rmcp::model::CacheScope>) = (None, None);

/// A result the gateway relays as complete: 2026-07-28 requires
/// `resultType` and a server of an older revision sends none (rmcp takes it
/// off again for a client of an older revision).
pub(super) trait Completed {
    fn completed(self) -> Self;
}

macro_rules! completed {
    ($($result:ty),*) => {$(
        impl Completed for $result {
            fn completed(mut self) -> Self {
                self.result_type.get_or_insert(ResultType::COMPLETE);
                self
            }
        }
    )*};
}

completed!(
    CallToolResult,
    GetPromptResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ReadResourceResult,
    CompleteResult
);

/// What the gateway uses of the request that carries a call, a prompt or
/// a read, besides its parameters: rmcp's `RequestContext`
/// ([`Invocation::of`]) or, for the plain stateless `tools/call` the HTTP
/// edge answers itself (`crate::http::mcp`), the request's id, `_meta` and
/// the edge's stream ([`Invocation::plain`]).
pub struct Invocation<'a> {
    id: RequestId,
    meta: RequestMeta,
    stream: InvocationStream<'a>,
}

/// Where what is sent before a request's result goes.
enum InvocationStream<'a> {
    /// rmcp's, with the token the client's `notifications/cancelled` fires.
    Rmcp {
        peer: &'a Peer<RoleServer>,
        cancelled: &'a CancellationToken,
    },
    /// The lean edge's; the request ends when its client goes away (its
    /// future is dropped).
    Relay(&'a RelaySender),
}

impl<'a> Invocation<'a> {
    /// A request rmcp serves (a session's, or one on its own stream):
    /// rmcp moved the request's `_meta` into its context.
    pub fn of(context: &'a RequestContext<RoleServer>) -> Self {
        Invocation {
            id: context.id.clone(),
            meta: RequestMeta::of(&context.meta),
            stream: InvocationStream::Rmcp {
                peer: &context.peer,
                cancelled: &context.ct,
            },
        }
    }

    /// A request the lean edge serves on `relay`.
    pub fn plain(id: RequestId, meta: RequestMeta, relay: &'a RelaySender) -> Self {
        Invocation {
            id,
            meta,
            stream: InvocationStream::Relay(relay),
        }
    }

    /// rmcp's client, which can be asked on a session.
    fn peer(&self) -> Option<&'a Peer<RoleServer>> {
        match self.stream {
            InvocationStream::Rmcp { peer, .. } => Some(peer),
            InvocationStream::Relay(_) => None,
        }
    }

    /// The stream relayed notifications go on.
    fn client_stream(&self) -> ClientStream {
        match self.stream {
            InvocationStream::Rmcp { peer, .. } => ClientStream::Peer(peer.clone()),
            InvocationStream::Relay(relay) => ClientStream::Relay(relay.clone()),
        }
    }

    /// Resolves when the client cancels the request.
    async fn cancelled(&self) {
        match self.stream {
            InvocationStream::Rmcp { cancelled, .. } => cancelled.cancelled().await,
            InvocationStream::Relay(_) => std::future::pending().await,
        }
    }
}

fn gateway_request(context: &RequestContext<RoleServer>) -> Result<GatewayRequest, ErrorData> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<GatewayRequest>())
        .cloned()
        .ok_or_else(|| ErrorData::internal_error("request did not come through the gateway", None))
}

impl GatewayServer {
    /// What the edge attached to this request; notes the session's key.
    fn request_of(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<GatewayRequest, ErrorData> {
        let request = gateway_request(context)?;
        if let Some(key) = &request.session {
            let _ = self.leases.set(key.clone());
        }
        Ok(request)
    }
}

impl GatewayServer {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.current()
    }

    /// The server `/mcp/{id}` serves, if the caller may use it.
    fn server(&self, request: &GatewayRequest, id: &str) -> Result<Arc<StoredServer>, ErrorData> {
        self.snapshot()
            .get(id)
            .filter(|server| server_selected(&server.spec, &request.task.policy, None).is_ok())
            .cloned()
            .ok_or_else(|| {
                ErrorData::invalid_request(
                    format!("{id:?} is not a server available to this caller"),
                    None,
                )
            })
    }

    /// The servers an endpoint serves to this caller.
    fn servers(&self, request: &GatewayRequest) -> Result<Vec<Arc<StoredServer>>, ErrorData> {
        let snapshot = self.snapshot();
        Ok(match &request.scope {
            Scope::Server(id) => vec![self.server(request, id)?],
            Scope::Catalog { .. } => snapshot
                .servers
                .values()
                .filter(|server| request.scope.covers(&server.spec.server_id))
                .filter(|server| server_selected(&server.spec, &request.task.policy, None).is_ok())
                .cloned()
                .collect(),
        })
    }

    fn content_filter(server: &StoredServer) -> Result<ServerContentFilter, ErrorData> {
        ServerContentFilter::new(&server.spec)
            .map_err(|err| ErrorData::internal_error(format!("record patterns: {err}"), None))
    }

    /// The one server of `/mcp/{id}`, or an error for the catalog endpoint
    /// (which serves only what can be named across servers).
    fn single(&self, request: &GatewayRequest, what: &str) -> Result<Arc<StoredServer>, ErrorData> {
        match &request.scope {
            Scope::Server(id) => self.server(request, id),
            Scope::Catalog { .. } => Err(ErrorData::new(
                RpcCode::METHOD_NOT_FOUND,
                format!("{what} is served on /mcp/{{server_id}}, not on the catalog endpoint"),
                None,
            )),
        }
    }

    fn capabilities(scope: &Scope, upstream: Option<&ServerCapabilities>) -> ServerCapabilities {
        let mut tools = ToolsCapability::default();
        tools.list_changed = Some(true);
        let mut prompts = PromptsCapability::default();
        prompts.list_changed = Some(true);
        let mut resources = ResourcesCapability::default();
        resources.list_changed = Some(true);
        let mut capabilities = ServerCapabilities::default();
        match (scope, upstream) {
            // As the server itself: what it offers, with list changes
            // announced (registry edits change the lists too).
            (Scope::Server(_), Some(upstream)) => {
                capabilities.tools = upstream.tools.as_ref().map(|_| tools);
                capabilities.prompts = upstream.prompts.as_ref().map(|_| prompts);
                capabilities.resources = upstream.resources.as_ref().map(|own| {
                    resources.subscribe = own.subscribe;
                    resources
                });
                capabilities.completions = upstream.completions.clone();
                capabilities.logging = upstream.logging.clone();
            }
            _ => {
                capabilities.tools = Some(tools);
                capabilities.prompts = Some(prompts);
                capabilities.resources = Some(resources);
            }
        }
        capabilities
    }

    /// The key of a round of `method` on `target` for this caller.
    fn round_key(
        &self,
        request: &GatewayRequest,
        method: &'static str,
        target: &str,
        arguments: serde_json::Value,
    ) -> RoundKey {
        RoundKey {
            caller: request.caller.clone(),
            scope: request.scope.clone(),
            method,
            target: target.to_owned(),
            arguments,
        }
    }

    /// The round of a request without a session (2026-07-28); `None` for a
    /// session's request, whose client the server asks directly.
    fn round(
        &self,
        invocation: &Invocation<'_>,
        key: RoundKey,
        carried: Carried,
    ) -> Result<Option<Round>, ErrorData> {
        if self.registered.get().is_some() {
            return Ok(None);
        }
        let capabilities = invocation
            .meta
            .client_capabilities
            .clone()
            .unwrap_or_default();
        Round::open(&self.shared.states, key, carried, capabilities).map(Some)
    }

    /// Where what the server sends about a request goes: the session's
    /// client, or the request's own stream and round.
    fn attachment(
        &self,
        invocation: &Invocation<'_>,
        round: Option<&Round>,
    ) -> Option<(Arc<DownstreamPeer>, CallAttachment)> {
        let downstream = match (self.registered.get(), round) {
            (Some(registered), _) => Downstream::of_session(&registered.session),
            (None, Some(round)) => Downstream::of_request(
                invocation.client_stream(),
                round.inputs.clone(),
                invocation.meta.log_level,
            ),
            (None, None) => return None,
        };
        let peer = Arc::new(DownstreamPeer::new(downstream, invocation.id.clone()));
        let attachment = CallAttachment {
            peer: peer.clone(),
            progress_token: invocation.meta.progress_token.clone(),
        };
        Some((peer, attachment))
    }
}

impl GatewayServer {
    /// What the endpoint says of itself (`initialize`, `server/discover`):
    /// `/mcp/{id}` is the server as it introduced itself to the worker,
    /// with list changes announced; `/mcp` the gateway's catalog.
    async fn info_for(&self, request: &GatewayRequest) -> Result<ServerConfig, ErrorData> {
        Ok(match &request.scope {
            Scope::Server(id) => {
                let server = self.server(request, id)?;
                let principal = request.caller.grant_principal();
                let upstream = match self
                    .shared
                    .runner
                    .pool()
                    .server_info(&server, principal.as_deref())
                    .await
                {
                    Ok(upstream) => upstream,
                    // A caller who has not connected its account yet is
                    // asked when it calls; until then the endpoint says only
                    // what the gateway knows.
                    Err(McpError::AuthorizationRequired(_)) => {
                        return Ok(
                            InitializeResult::new(Self::capabilities(&request.scope, None))
                                .with_server_info(Implementation::new(id.clone(), "")),
                        );
                    }
                    Err(err) => return Err(forward_error(err.into())),
                };
                let mut info = InitializeResult::new(Self::capabilities(
                    &request.scope,
                    Some(&upstream.capabilities),
                ));
                if let Some(implementation) = &upstream.server_info {
                    info = info.with_server_info(implementation.clone());
                }
                info.instructions = upstream.instructions.clone();
                info
            }
            Scope::Catalog { .. } => self.get_info(),
        })
    }
}

impl ServerHandler for GatewayServer {
    fn get_info(&self) -> ServerConfig {
        self.info.get().cloned().unwrap_or_else(|| {
            InitializeResult::new(Self::capabilities(&Scope::catalog(None), None)).with_server_info(
                Implementation::new("quiver-gateway", env!("CARGO_PKG_VERSION")),
            )
        })
    }

    /// Every revision rmcp knows: up to 2025-11-25 with an `initialize`
    /// handshake and a session, 2026-07-28 without either (each request
    /// stands alone; any worker serves it).
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        let request = self.request_of(&context)?;
        let info = self.info_for(&request).await?;
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            info,
        ))
    }

    /// `subscriptions/listen` (2026-07-28): list changes of everything the
    /// endpoint serves this caller, and updates of the resources it names
    /// that the record allows, as on a session (R-GW-5).
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = Some(true);
        accepted.prompts_list_changed = Some(true);
        accepted.resources_list_changed = Some(true);
        accepted.resource_subscriptions = requested.resource_subscriptions.clone();
        Some(accepted)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        let context = subscription.request_context();
        let request = self.request_of(context)?;
        let allowed: BTreeSet<String> = match &request.scope {
            Scope::Server(id) => {
                let server = self.server(&request, id)?;
                let filter = Self::content_filter(&server)?;
                subscription
                    .accepted()
                    .resource_subscriptions
                    .iter()
                    .flatten()
                    .filter(|uri| filter.allows_resource(uri))
                    .cloned()
                    .collect()
            }
            Scope::Catalog { .. } => BTreeSet::new(),
        };
        let _registered = self.shared.sessions.register(LiveSession {
            peer: context.peer.clone(),
            listen: Some(subscription.sink().clone()),
            caller: crate::gateway::sessions::caller_of(context),
            task: request.task.clone(),
            scope: request.scope.clone(),
            subscriptions: std::sync::Mutex::new(allowed),
            log_level: Default::default(),
            relay_slots: Arc::new(tokio::sync::Semaphore::new(RELAY_SLOTS)),
        });
        subscription.cancelled().await;
        Ok(())
    }

    async fn initialize(
        &self,
        params: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        let request = self.request_of(&context)?;
        context.peer.set_peer_info(params.clone());
        let info = self.info_for(&request).await?;
        let _ = self.info.set(info);
        let _ = self
            .registered
            .set(self.shared.sessions.register(LiveSession {
                peer: context.peer.clone(),
                listen: None,
                caller: crate::gateway::sessions::caller_of(&context),
                task: request.task.clone(),
                scope: request.scope.clone(),
                subscriptions: Default::default(),
                log_level: Default::default(),
                relay_slots: Arc::new(tokio::sync::Semaphore::new(RELAY_SLOTS)),
            }));
        self.negotiate_initialize(&params)
    }

    async fn list_tools(
        &self,
        _params: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let request = self.request_of(&context)?;
        self.list(&request).await
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let request = self.request_of(&context)?;
        self.call(&request, params, &Invocation::of(&context)).await
    }

    async fn list_prompts(
        &self,
        params: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let request = self.request_of(&context)?;
        let cursor = params.and_then(|p| p.cursor);
        if let Scope::Server(id) = &request.scope {
            let server = self.server(&request, id)?;
            return self.prompts_of(&request, &server, cursor).await;
        }
        // The catalog endpoint names prompts like tools: unambiguous across servers.
        let mut prompts = Vec::new();
        for server in self.servers(&request)? {
            let listed = Self::all_pages(|cursor| async {
                let page = self.prompts_of(&request, &server, cursor).await?;
                Ok((page.prompts, page.next_cursor))
            })
            .await;
            for mut prompt in listed {
                let Ok(name) = injected_name(&server.spec.server_id, &prompt.name) else {
                    continue;
                };
                let readable = prompt.title.clone().unwrap_or_else(|| prompt.name.clone());
                prompt.title = Some(format!("{} · {readable}", server.spec.server_id));
                prompt.name = name;
                prompts.push(prompt);
            }
        }
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        mut params: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let request = self.request_of(&context)?;
        let server = match &request.scope {
            Scope::Server(id) => self.server(&request, id)?,
            Scope::Catalog { .. } => {
                let reference = parse_injected_name(&params.name)
                    .into_iter()
                    .find(|reference| request.scope.covers(&reference.server_id))
                    .ok_or_else(|| {
                        ErrorData::invalid_params(format!("unknown prompt {:?}", params.name), None)
                    })?;
                let server = self.server(&request, &reference.server_id)?;
                params.name = reference.tool_name;
                server
            }
        };
        if !Self::content_filter(&server)?.allows_prompt(&params.name) {
            return Err(ErrorData::invalid_params(
                format!("prompt {:?} is not available to this caller", params.name),
                None,
            ));
        }
        let carried = Carried {
            responses: params.input_responses.take(),
            state: params.request_state.take(),
        };
        let arguments = params
            .arguments
            .clone()
            .map_or(serde_json::Value::Null, serde_json::Value::Object);
        let key = self.round_key(&request, "prompts/get", &params.name, arguments);
        let invocation = Invocation::of(&context);
        let round = self.round(&invocation, key, carried)?;
        (params.input_responses, params.request_state) = upstream_params(round.as_ref());
        let attachment = self.attachment(&invocation, round.as_ref()).map(|(_, a)| a);
        let prompt = self.forward_attached(&request, &server, attachment, |peer| async move {
            peer.get_prompt_once(params).await.map(ServerResult::from)
        });
        Ok(
            match in_round(round.as_ref(), std::pin::pin!(prompt)).await? {
                Settled::Done(ServerResult::GetPromptResult(prompt)) => prompt.completed().into(),
                Settled::Done(other) => {
                    GetPromptResponse::InputRequired(passed_on(round.as_ref(), other)?)
                }
                Settled::InputRequired(asked) => GetPromptResponse::InputRequired(asked),
            },
        )
    }

    async fn list_resources(
        &self,
        params: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let request = self.request_of(&context)?;
        let cursor = params.and_then(|p| p.cursor);
        if let Scope::Server(id) = &request.scope {
            let server = self.server(&request, id)?;
            return self.resources_of(&request, &server, cursor).await;
        }
        let mut resources = Vec::new();
        for server in self.servers(&request)? {
            resources.extend(
                Self::all_pages(|cursor| async {
                    let page = self.resources_of(&request, &server, cursor).await?;
                    Ok((page.resources, page.next_cursor))
                })
                .await,
            );
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        params: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let request = self.request_of(&context)?;
        let server = self.single(&request, "resources/templates/list")?;
        let filter = Self::content_filter(&server)?;
        let mut listed = self
            .forward(&request, &server, |peer| async move {
                peer.list_resource_templates(params).await
            })
            .await?;
        listed
            .resource_templates
            .retain(|template| filter.allows_resource(&template.uri_template));
        (listed.ttl_ms, listed.cache_scope) = GATEWAY_CACHE_HINTS;
        Ok(listed.completed())
    }

    async fn read_resource(
        &self,
        params: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let request = self.request_of(&context)?;
        if let Scope::Server(id) = &request.scope {
            let server = self.server(&request, id)?;
            return self
                .read_from(&Invocation::of(&context), &request, &server, params)
                .await;
        }
        // The catalog endpoint keeps resource URIs as the servers give them:
        // the first server that allows and has the resource answers.
        if let Err(refusal) = resource_uri::check(&params.uri) {
            return Err(uri_refused(&params.uri, refusal));
        }
        for server in self.servers(&request)? {
            if !Self::content_filter(&server)?.allows_resource(&params.uri) {
                continue;
            }
            match self
                .read_from(&Invocation::of(&context), &request, &server, params.clone())
                .await
            {
                Ok(read) => return Ok(read),
                Err(err)
                    if err.code == RpcCode::RESOURCE_NOT_FOUND
                        || err.code == RpcCode::INVALID_PARAMS =>
                {
                    continue;
                }
                Err(err) => return Err(err),
            }
        }
        Err(not_found(&format!("resource {:?} not found", params.uri)))
    }

    async fn subscribe(
        &self,
        params: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let request = self.request_of(&context)?;
        let server = self.single(&request, "resources/subscribe")?;
        resource_allowed(&Self::content_filter(&server)?, &params.uri)?;
        let uri = params.uri.clone();
        self.forward(&request, &server, |peer| async move {
            peer.subscribe(params).await
        })
        .await?;
        if let Some(registered) = self.registered.get() {
            registered
                .session
                .subscriptions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(uri);
        }
        Ok(())
    }

    async fn unsubscribe(
        &self,
        params: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let request = self.request_of(&context)?;
        let server = self.single(&request, "resources/unsubscribe")?;
        resource_allowed(&Self::content_filter(&server)?, &params.uri)?;
        let Some(registered) = self.registered.get() else {
            return Ok(());
        };
        registered
            .session
            .subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&params.uri);
        // The server's connection is shared: it stays subscribed while
        // another session wants the updates.
        if self.shared.sessions.subscribed_elsewhere(
            &registered.session,
            &server.spec.server_id,
            &params.uri,
        ) {
            return Ok(());
        }
        self.forward(&request, &server, |peer| async move {
            peer.unsubscribe(params).await
        })
        .await
    }

    async fn complete(
        &self,
        params: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let request = self.request_of(&context)?;
        let server = self.single(&request, "completion/complete")?;
        let filter = Self::content_filter(&server)?;
        let allowed = match &params.r#ref {
            Reference::Prompt(prompt) => filter.allows_prompt(&prompt.name),
            Reference::Resource(template) => filter.allows_resource(&template.uri),
            _ => false,
        };
        if !allowed {
            return Err(ErrorData::invalid_params(
                "the completion's reference is not available to this caller",
                None,
            ));
        }
        // A resource template's values are judged as the URIs they make
        // (docs/reference.md §13.5): one that names a resource the caller
        // may not use is left out.
        let template = match &params.r#ref {
            Reference::Resource(template) => Some((
                template.uri.clone(),
                params.argument.name.clone(),
                params
                    .context
                    .as_ref()
                    .and_then(|context| context.arguments.clone())
                    .unwrap_or_default(),
            )),
            _ => None,
        };
        let mut completed: CompleteResult = self
            .forward(&request, &server, |peer| async move {
                peer.complete(params).await
            })
            .await?;
        if let Some((uri, argument, context)) = template {
            let before = completed.completion.values.len();
            completed.completion.values.retain(|value| {
                let expanded = resource_uri::expand_template(&uri, |name| {
                    if name == argument {
                        Some(value.as_str())
                    } else {
                        context.get(name).map(String::as_str)
                    }
                });
                filter.allows_resource(&expanded)
            });
            let removed = before - completed.completion.values.len();
            if removed > 0
                && let Some(total) = completed.completion.total.as_mut()
            {
                *total = total.saturating_sub(u32::try_from(removed).unwrap_or(u32::MAX));
            }
        }
        Ok(completed.completed())
    }

    /// Sets the level of the server's log messages relayed to this session.
    /// The server's connection is shared, so its own level is not changed.
    async fn set_level(
        &self,
        params: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.request_of(&context)?;
        if let Some(registered) = self.registered.get() {
            *registered
                .session
                .log_level
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(params.level);
        }
        Ok(())
    }
}
