//! Gateway mode (docs/reference.md §13.4): the worker as an MCP server over
//! streamable HTTP, at `/mcp` (the caller's whole catalog) and
//! `/mcp/{server_id}` (one server as itself).
//!
//! rmcp's `StreamableHttpService` speaks the transport; this module gives it
//! a server per session ([`server::GatewayServer`], which calls tools on the
//! tool API's path), makes sessions portable across workers
//! ([`session_id`], [`store`]), tells open sessions what changed
//! ([`sessions`]) and relays what a server sends about a call to the client
//! that made it ([`peer`]). The HTTP edge (`crate::http::mcp`) checks
//! `Host`/`Origin` ([`rebinding`]), the caller's token and the POST body
//! before a request gets here.

pub mod approval;
pub mod consent;
pub mod inputs;
pub mod peer;
pub mod rebinding;
pub mod relayed;
pub mod request_meta;
pub mod request_state;
pub mod revoked;
pub mod round;
pub mod scope;
pub mod server;
pub mod session_id;
pub mod sessions;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Request, StatusCode};
use quiver_model::ErrorCode;
use rmcp::model::{
    CallToolRequestParams, ErrorCode as RpcCode, RequestId, ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::call::ToolRunner;
use crate::error::ErrorObject;
use crate::gateway::peer::RelaySender;
use crate::gateway::request_meta::RequestMeta;
use crate::gateway::request_state::RequestStates;
use crate::gateway::revoked::Revoked;
use crate::gateway::server::{GatewayRequest, GatewayServer, Invocation, Shared};
use crate::gateway::session_id::{Binding, SessionSigner, SessionToken, now_ms};
use crate::gateway::sessions::{Full, SessionCaller};
use crate::gateway::store::GatewaySessionStore;

/// The MCP session header (streamable HTTP transport).
pub const SESSION_HEADER: &str = "mcp-session-id";

/// How the gateway runs.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// `Host` values the MCP endpoints accept (`host` or `host:port`); empty:
    /// loopback names on a loopback listener, any otherwise.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted (`scheme://host[:port]`); empty: loopback
    /// origins on a loopback listener, same origin otherwise.
    pub allowed_origins: Vec<String>,
    /// The fleet's secret for signing session ids; `None`: a random one
    /// (sessions then only resume on the worker that opened them).
    pub session_secret: Option<Vec<u8>>,
    /// Sessions open at once on this worker, opened here or resumed from
    /// another worker; `initialize` or a resume beyond is refused (503
    /// `mcp_unavailable`).
    pub max_sessions: usize,
    /// Sessions one caller (token) may hold open at once on this worker;
    /// `None`: a quarter of `max_sessions` (at least 1). Beyond: 503
    /// `mcp_unavailable` naming it; other callers are unaffected.
    pub max_sessions_per_caller: Option<usize>,
    /// A session id is served this long after it was issued, then answered
    /// 404 (the client initializes again).
    pub max_session_lifetime: Duration,
    /// A session unused this long is dropped from memory (its signed id
    /// still resumes it).
    pub session_idle: Duration,
    /// Largest request body.
    pub max_request_bytes: usize,
    /// The registry's memory of deleted sessions (shared by the fleet);
    /// `None`: deletions are remembered by this worker alone.
    pub registry: Option<quiver_sync::RegistrySessions>,
}

/// Longest `max_session_lifetime` (the registry remembers a deletion at most
/// this long).
pub const MAX_SESSION_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

impl GatewayOptions {
    /// The per-caller session cap in effect.
    pub fn per_caller_cap(&self) -> usize {
        self.max_sessions_per_caller
            .unwrap_or((self.max_sessions / 4).max(1))
    }
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            session_secret: None,
            max_sessions: 10_000,
            max_sessions_per_caller: None,
            max_session_lifetime: Duration::from_secs(24 * 3600),
            session_idle: Duration::from_secs(600),
            max_request_bytes: crate::limits::MAX_REQUEST_BODY_BYTES,
            registry: None,
        }
    }
}

/// The gateway of one worker; cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    service: StreamableHttpService<GatewayServer, LocalSessionManager>,
    manager: Arc<LocalSessionManager>,
    revoked: Revoked,
    shared: Arc<Shared>,
    signer: SessionSigner,
    store: Arc<GatewaySessionStore>,
    options: GatewayOptions,
    sse_keep_alive: Option<Duration>,
}

/// What the HTTP edge read of a POST body (`crate::http::mcp`).
#[derive(Debug, Default)]
pub struct Posted {
    /// The JSON-RPC method (empty for a response).
    pub method: String,
    /// The protocol version an `initialize` asks for.
    pub protocol_version: Option<String>,
}

/// A JSON-RPC error response with HTTP status `status` (the transport's
/// answers outside any session, e.g. an unknown session: 404).
pub fn jsonrpc_error(status: StatusCode, code: i32, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    });
    (status, axum::Json(body)).into_response()
}

impl Gateway {
    /// The gateway over `runner`'s pool and the worker's snapshot; its
    /// sessions end when `shutdown` is cancelled.
    pub fn new(
        runner: ToolRunner,
        snapshot: quiver_sync::SnapshotHandle,
        options: GatewayOptions,
        shutdown: &CancellationToken,
    ) -> Gateway {
        let states = options
            .session_secret
            .as_deref()
            .map_or_else(RequestStates::random, RequestStates::new);
        let shared = Arc::new(Shared {
            runner,
            snapshot,
            sessions: Arc::default(),
            states,
        });
        let store = Arc::new(GatewaySessionStore::default());
        let mut manager = LocalSessionManager::default();
        manager.session_config.keep_alive = Some(options.session_idle);
        // Host and Origin are checked at the edge (`rebinding`), before the
        // caller's token, so a rebinding attempt is refused whatever it sends.
        let mut config = StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_cancellation_token(shutdown.child_token())
            .with_max_request_body_bytes(options.max_request_bytes)
            // A 2026-07-28 request answered by its result alone gets it as
            // JSON, without an SSE stream; one whose handler sends anything
            // first (progress, logs) still gets a stream.
            .with_json_response(true);
        config.session_store = Some(store.clone());
        let sse_keep_alive = config.sse_keep_alive;
        let factory_shared = shared.clone();
        let manager = Arc::new(manager);
        let service = StreamableHttpService::new(
            move || Ok(GatewayServer::new(factory_shared.clone())),
            manager.clone(),
            config,
        );
        let signer = options
            .session_secret
            .as_deref()
            .map_or_else(SessionSigner::random, SessionSigner::new);
        Gateway {
            inner: Arc::new(Inner {
                service,
                manager,
                revoked: Revoked::new(options.registry.clone()),
                shared,
                signer,
                store,
                options,
                sse_keep_alive,
            }),
        }
    }

    /// The largest request body the gateway takes.
    pub fn max_request_bytes(&self) -> usize {
        self.inner.options.max_request_bytes
    }

    /// Tells open sessions about changes until `shutdown` (see [`sessions`]).
    pub async fn follow_changes(&self, shutdown: CancellationToken) {
        let shared = &self.inner.shared;
        sessions::follow_changes(
            shared.sessions.clone(),
            shared.snapshot.clone(),
            shared.runner.pool().clone(),
            shutdown,
        )
        .await;
    }

    /// Serves one HTTP request of an authenticated caller whose POST body
    /// (`posted`) the edge read and judged; a refusal of the worker's own
    /// (§10 error object, e.g. the session caps) is the edge's to answer.
    pub async fn handle(
        &self,
        mut request_info: GatewayRequest,
        posted: Option<Posted>,
        request: Request<Body>,
    ) -> Result<Response, ErrorObject> {
        let method = request.method().clone();
        let (mut parts, body) = request.into_parts();
        let endpoint = request_info.scope.endpoint();
        // A session is bound to its caller's principal: a configured token's
        // id, or an identity provider's `oidc:<issuer>#<sub>` (whose tokens
        // are refreshed during a session).
        let caller = request_info.caller.principal();
        let binding = Binding {
            caller: &caller,
            endpoint: &endpoint,
        };
        // Whether the request resumes a session this worker does not hold.
        let mut resumes = false;
        // A presented session must be signed for this caller and endpoint,
        // unexpired and not deleted.
        if let Some(presented) = parts.headers.get(SESSION_HEADER) {
            let token = presented
                .to_str()
                .ok()
                .and_then(|presented| self.inner.signer.verify(presented, &binding));
            let Some(token) = token else {
                return Ok(jsonrpc_error(
                    StatusCode::NOT_FOUND,
                    -32001,
                    "Session not found: unknown, expired or not signed for this caller and endpoint; initialize a new session",
                ));
            };
            let held = match self.admit_session(&token, &method).await {
                Ok(held) => held,
                Err(refused) => return Ok(refused),
            };
            resumes = !held && method != http::Method::DELETE;
            request_info.session = Some(request_info.caller.session(
                &request_info.task,
                quiver_mcp::leases::SessionKind::Gateway,
                token.inner.clone(),
            ));
            self.inner
                .store
                .verified(&token.inner, &token.protocol_version);
            match HeaderValue::from_str(&token.inner) {
                Ok(inner) => parts.headers.insert(SESSION_HEADER, inner),
                Err(_) => return Ok(StatusCode::NOT_FOUND.into_response()),
            };
        }
        let Posted {
            method: rpc_method,
            protocol_version,
        } = posted.unwrap_or_default();
        let initialize = rpc_method == "initialize";
        // A session opened or resumed here, or a 2026-07-28 listen stream,
        // takes a slot (both caps) for the length of the request; once open
        // it counts by itself.
        let listens = rpc_method == "subscriptions/listen";
        let _admission = if initialize || resumes || listens {
            let options = &self.inner.options;
            match self.inner.shared.sessions.admit(
                &caller,
                options.max_sessions,
                options.per_caller_cap(),
            ) {
                Ok(admission) => Some(admission),
                Err(full) => {
                    let message = match full {
                        Full::Sessions(cap) => format!(
                            "gateway session capacity reached (max_sessions = {cap}); retry later"
                        ),
                        Full::Caller(cap) => format!(
                            "this caller's gateway sessions reached max_sessions_per_caller = {cap}; end one (DELETE) or retry later"
                        ),
                    };
                    let error =
                        ErrorObject::new(ErrorCode::McpUnavailable, message).with_retryable(true);
                    return Err(error);
                }
            }
        } else {
            None
        };
        parts.extensions.insert(SessionCaller(caller.clone()));
        parts.extensions.insert(request_info);
        let response = self
            .inner
            .service
            .handle(Request::from_parts(parts, body))
            .await;
        let (mut response_parts, response_body) = response.into_parts();
        if initialize
            && let Some(inner) = response_parts
                .headers
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
        {
            let signed = self.inner.signer.sign(
                inner,
                protocol_version.as_deref().unwrap_or_default(),
                now_ms(),
                &binding,
            );
            if let Ok(signed) = HeaderValue::from_str(&signed) {
                response_parts.headers.insert(SESSION_HEADER, signed);
            }
        }
        Ok(Response::from_parts(
            response_parts,
            Body::new(response_body),
        ))
    }

    /// Answers a plain stateless `tools/call` (the lean edge of
    /// `crate::http::mcp`) without rmcp's per-request service: the same
    /// handler ([`GatewayServer::call`]), what it relays going to `relay`,
    /// and the epilogue rmcp's server dispatch gives a 2026-07-28 answer
    /// (caching hints; -32002 becomes -32602).
    pub fn call_plain(
        &self,
        request: GatewayRequest,
        id: RequestId,
        meta: RequestMeta,
        params: CallToolRequestParams,
        relay: RelaySender,
    ) -> impl Future<Output = ServerJsonRpcMessage> + Send + 'static {
        let server = GatewayServer::new(self.inner.shared.clone());
        async move {
            let invocation = Invocation::plain(id.clone(), meta, &relay);
            match server.call(&request, params, &invocation).await {
                Ok(response) => {
                    let mut result = ServerResult::from(response);
                    result.fill_missing_cache_hints();
                    ServerJsonRpcMessage::response(result, id)
                }
                Err(mut error) => {
                    if error.code == RpcCode::RESOURCE_NOT_FOUND {
                        error.code = RpcCode::INVALID_PARAMS;
                    }
                    ServerJsonRpcMessage::error(error, Some(id))
                }
            }
        }
    }

    /// How often an SSE answer without news carries a keep-alive comment
    /// (rmcp's setting, for the lean edge's answers too).
    pub fn sse_keep_alive(&self) -> Option<Duration> {
        self.inner.sse_keep_alive
    }

    /// Judges a verified session id before its request is served: 404 when
    /// it expired or was deleted (here, through another worker, or now:
    /// a `DELETE` is remembered and told to the registry first); otherwise
    /// whether this worker holds the session.
    async fn admit_session(
        &self,
        token: &SessionToken,
        method: &http::Method,
    ) -> Result<bool, Response> {
        let lifetime = self.inner.options.max_session_lifetime;
        let expires_ms = token.expires_ms(lifetime);
        let session_id: rmcp::transport::streamable_http_server::SessionId =
            Arc::from(token.inner.as_str());
        if now_ms() >= expires_ms {
            // Held here: it ends now rather than when idle.
            let _ = self.inner.manager.close_session(&session_id).await;
            return Err(jsonrpc_error(
                StatusCode::NOT_FOUND,
                -32001,
                &format!(
                    "Session not found: expired (max_session_lifetime = {} s); initialize a new session",
                    lifetime.as_secs()
                ),
            ));
        }
        let held = self
            .inner
            .manager
            .has_session(&session_id)
            .await
            .unwrap_or(false);
        let digest = token.digest();
        if *method == http::Method::DELETE {
            // Remembered (and told to the registry) before the session
            // closes, so no concurrent request restores it meanwhile.
            self.inner.revoked.revoke(&digest, expires_ms).await;
            self.inner.revoked.forget_check(&digest);
        } else if self.inner.revoked.is_revoked(&digest, held).await {
            if held {
                // Deleted through another worker: it ends here too.
                let _ = self.inner.manager.close_session(&session_id).await;
            }
            self.inner.revoked.forget_check(&digest);
            return Err(jsonrpc_error(
                StatusCode::NOT_FOUND,
                -32001,
                "Session not found: the session was deleted; initialize a new session",
            ));
        }
        Ok(held)
    }
}
