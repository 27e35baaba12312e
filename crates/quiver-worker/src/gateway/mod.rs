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
//! `Host`/`Origin` ([`rebinding`]) and the caller's token before a request
//! gets here.

pub mod inputs;
pub mod peer;
pub mod rebinding;
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
use quiver_mcp::ErrorCode;
use quiver_model::policy::server_selected;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::call::ToolRunner;
use crate::error::ErrorObject;
use crate::gateway::request_state::RequestStates;
use crate::gateway::revoked::Revoked;
use crate::gateway::scope::Scope;
use crate::gateway::server::{GatewayRequest, GatewayServer, Shared};
use crate::gateway::session_id::{Binding, SessionSigner, SessionToken, now_ms};
use crate::gateway::sessions::{Full, SessionCaller};
use crate::gateway::store::GatewaySessionStore;

/// The MCP session header (streamable HTTP transport).
pub const SESSION_HEADER: &str = "mcp-session-id";

/// The protocol's method names (labels of `mcp_gateway_requests_total`).
const MCP_METHODS: &[&str] = &[
    "initialize",
    "server/discover",
    "subscriptions/listen",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
];

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

/// JSON nested deeper than this is refused at the edge (-32700), before
/// any parser recurses into it.
pub const MAX_JSON_DEPTH: usize = 64;

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
            max_request_bytes: crate::http::MAX_REQUEST_BODY_BYTES,
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
}

/// The part of a JSON-RPC message the gateway looks at, read in one pass
/// without building the message (rmcp parses it after).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a str>,
    #[serde(borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    result: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    error: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    params: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    id: Option<&'a serde_json::value::RawValue>,
}

/// How deep `body` nests arrays and objects (outside strings), counting
/// no further than `limit + 1`.
fn json_depth(body: &[u8], limit: usize) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in body {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > limit {
                    return deepest;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Whether a JSON-RPC id is one MCP allows: a string or an integer.
fn valid_id(id: &serde_json::value::RawValue) -> bool {
    let text = id.get();
    (text.starts_with('"') && serde_json::from_str::<String>(text).is_ok())
        || serde_json::from_str::<i64>(text).is_ok()
}

#[derive(Deserialize)]
struct InitializeParams {
    #[serde(rename = "protocolVersion")]
    protocol_version: Option<String>,
}

/// What the gateway takes from a POST body.
struct Posted {
    method: String,
    /// The protocol version an `initialize` asks for.
    protocol_version: Option<String>,
}

/// A JSON-RPC error response with HTTP status `status` (the transport's
/// answers outside any session, e.g. an unknown session: 404).
fn jsonrpc_error(status: StatusCode, code: i32, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    });
    (status, axum::Json(body)).into_response()
}

/// What a POST body says, or the JSON-RPC error the transport spec
/// prescribes for it: -32700 for a body that is not JSON, -32600 for JSON
/// that is not one JSON-RPC 2.0 message (batches were removed in 2025-06-18).
#[expect(clippy::result_large_err, reason = "the error is the response itself")]
fn jsonrpc_envelope(body: &[u8]) -> Result<Posted, Response> {
    let invalid = |detail: &str| {
        jsonrpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            &format!("Invalid Request: {detail}"),
        )
    };
    let parse_error = |detail: &str| {
        jsonrpc_error(
            StatusCode::BAD_REQUEST,
            -32700,
            &format!("Parse error: {detail}"),
        )
    };
    // Depth first: no parser (ours or rmcp's) recurses into a hostile body.
    if json_depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH {
        return Err(parse_error(&format!(
            "JSON nested deeper than {MAX_JSON_DEPTH} levels"
        )));
    }
    let envelope: Envelope<'_> = match serde_json::from_slice(body) {
        Ok(envelope) => envelope,
        // Valid JSON of another shape (an array, a number, fields of the
        // wrong type) is an invalid request; anything else a parse error.
        Err(err) if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() => {
            return Err(invalid(&err.to_string()));
        }
        Err(err) => return Err(parse_error(&err.to_string())),
    };
    if envelope.jsonrpc != Some("2.0")
        || (envelope.method.is_none() && envelope.result.is_none() && envelope.error.is_none())
    {
        return Err(invalid("the body must be one JSON-RPC 2.0 message"));
    }
    // A request or a result names its id: a string or an integer (MCP: not
    // null); an error may carry a null id (JSON-RPC 2.0 §5).
    let null_allowed = envelope.error.is_some() && envelope.method.is_none();
    match envelope.id {
        Some(id) if id.get() == "null" && null_allowed => {}
        Some(id) if !valid_id(id) => {
            return Err(invalid("id must be a string or an integer"));
        }
        None if envelope.method.is_none() => {
            return Err(invalid("a response must carry the id of its request"));
        }
        _ => {}
    }
    // The whole message as the transport will read it: what it cannot
    // read is refused here with the JSON-RPC error, not by the transport
    // as an unsupported media type.
    if let Err(err) = serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(body) {
        return Err(invalid(&err.to_string()));
    }
    let method = envelope.method.map(|m| m.into_owned()).unwrap_or_default();
    let protocol_version = (method == "initialize")
        .then_some(envelope.params)
        .flatten()
        .and_then(|params| serde_json::from_str::<InitializeParams>(params.get()).ok())
        .and_then(|params| params.protocol_version);
    Ok(Posted {
        method,
        protocol_version,
    })
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
            .with_max_request_body_bytes(options.max_request_bytes);
        config.session_store = Some(store.clone());
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
            }),
        }
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

    /// Serves one HTTP request of an authenticated caller.
    pub async fn handle(
        &self,
        mut request_info: GatewayRequest,
        request: Request<Body>,
    ) -> Response {
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
                return self.count(&method, "", jsonrpc_error(
                    StatusCode::NOT_FOUND,
                    -32001,
                    "Session not found: unknown, expired or not signed for this caller and endpoint; initialize a new session",
                ));
            };
            let held = match self.admit_session(&token, &method).await {
                Ok(held) => held,
                Err(refused) => return self.count(&method, "", refused),
            };
            resumes = !held && method != http::Method::DELETE;
            request_info.session_id = Some(token.inner.clone());
            self.inner
                .store
                .verified(&token.inner, &token.protocol_version);
            match HeaderValue::from_str(&token.inner) {
                Ok(inner) => parts.headers.insert(SESSION_HEADER, inner),
                Err(_) => return StatusCode::NOT_FOUND.into_response(),
            };
        }
        // POST bodies are read here (bounded) for the method and, for
        // `initialize`, the protocol version the session id will carry.
        let (body, posted) = if method == http::Method::POST {
            match axum::body::to_bytes(body, self.inner.options.max_request_bytes).await {
                Ok(bytes) => match jsonrpc_envelope(&bytes) {
                    Ok(posted) => (Body::from(bytes), Some(posted)),
                    Err(refused) => return self.count(&method, "", refused),
                },
                Err(_) => {
                    let error = ErrorObject::new(
                        ErrorCode::PayloadTooLarge,
                        format!(
                            "request body over {} bytes",
                            self.inner.options.max_request_bytes
                        ),
                    );
                    return self.count(
                        &method,
                        "",
                        crate::http::ApiError::from(error).into_response(),
                    );
                }
            }
        } else {
            (body, None)
        };
        let (rpc_method, protocol_version) = posted
            .map(|p| (p.method, p.protocol_version.unwrap_or_default()))
            .unwrap_or_default();
        let initialize = rpc_method == "initialize";
        if (initialize || rpc_method == "server/discover")
            && let Err(refused) = self.check_scope(&request_info)
        {
            return self.count(&method, &rpc_method, refused);
        }
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
                    return self.count(
                        &method,
                        &rpc_method,
                        crate::http::ApiError::from(error).into_response(),
                    );
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
            let signed = self
                .inner
                .signer
                .sign(inner, &protocol_version, now_ms(), &binding);
            if let Ok(signed) = HeaderValue::from_str(&signed) {
                response_parts.headers.insert(SESSION_HEADER, signed);
            }
        }
        let response = Response::from_parts(response_parts, Body::new(response_body));
        self.count(&method, &rpc_method, response)
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

    /// Refuses an `initialize` at an endpoint that would serve the caller
    /// nothing: `/mcp/{id}` or `/mcp?server_ids=…` naming only servers that
    /// are absent or that the caller's task does not select (404, naming
    /// them); no session is created.
    #[expect(clippy::result_large_err, reason = "the error is the response itself")]
    fn check_scope(&self, request: &GatewayRequest) -> Result<(), Response> {
        let named: Vec<&String> = match &request.scope {
            Scope::Server(id) => vec![id],
            Scope::Catalog {
                server_ids: Some(ids),
            } => ids.iter().collect(),
            Scope::Catalog { server_ids: None } => return Ok(()),
        };
        let snapshot = self.inner.shared.snapshot.current();
        let available = |id: &String| {
            snapshot.get(id).is_some_and(|server| {
                server_selected(&server.spec, &request.task.policy, None).is_ok()
            })
        };
        if named.iter().any(|id| available(id)) {
            return Ok(());
        }
        let error = ErrorObject::new(
            ErrorCode::NotFound,
            format!(
                "no server available to this caller at this endpoint: {}",
                named
                    .iter()
                    .map(|id| format!("{id:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        Err(crate::http::ApiError::from(error).into_response())
    }

    /// Counts a request in `mcp_gateway_requests_total`.
    fn count(&self, http_method: &http::Method, rpc_method: &str, response: Response) -> Response {
        // Methods are the client's strings: only the protocol's names
        // become labels, so a client cannot grow the metric without bound.
        let method = match rpc_method {
            "" => http_method.as_str(),
            known if MCP_METHODS.contains(&known) => known,
            _ => "other",
        };
        metrics::counter!(
            "mcp_gateway_requests_total",
            "method" => method.to_owned(),
            "status" => response.status().as_u16().to_string()
        )
        .increment(1);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code_of(body: &str) -> Option<u16> {
        jsonrpc_envelope(body.as_bytes())
            .err()
            .map(|response| response.status().as_u16())
    }

    #[test]
    fn post_bodies_are_judged_in_one_pass() {
        let posted = jsonrpc_envelope(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{}}}"#,
        )
        .unwrap_or_else(|_| panic!("initialize refused"));
        assert_eq!(posted.method, "initialize");
        assert_eq!(posted.protocol_version.as_deref(), Some("2025-06-18"));
        let call = jsonrpc_envelope(
            br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","arguments":{"protocolVersion":1}}}"#,
        )
        .unwrap_or_else(|_| panic!("tools/call refused"));
        assert_eq!(
            (call.method.as_str(), call.protocol_version),
            ("tools/call", None)
        );
        assert!(jsonrpc_envelope(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#).is_ok());
        for bad in ["{not json", "", "[1"] {
            assert_eq!(code_of(bad), Some(400), "{bad}");
        }
        for invalid in [
            "[]",
            "42",
            r#"{"id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
            r#"{"jsonrpc":"2.0","method":7}"#,
        ] {
            assert_eq!(code_of(invalid), Some(400), "{invalid}");
        }
    }

    fn rpc_code_of(body: &str) -> (u16, i64) {
        let response = jsonrpc_envelope(body.as_bytes())
            .err()
            .unwrap_or_else(|| panic!("{body} accepted"));
        let status = response.status().as_u16();
        let bytes =
            futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 16))
                .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON error");
        (status, body["error"]["code"].as_i64().unwrap_or_default())
    }

    #[test]
    fn bad_ids_and_deep_nesting_are_refused_with_their_jsonrpc_codes() {
        for bad_id in [
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":[1],"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":true,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":7}"#,
        ] {
            assert_eq!(rpc_code_of(bad_id), (400, -32600), "{bad_id}");
        }
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}1{}}}}}}}"#,
            "[".repeat(5_000),
            "]".repeat(5_000)
        );
        assert_eq!(rpc_code_of(&deep), (400, -32700));
        // Brackets inside strings do not count.
        let quoted = format!(
            r#"{{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{{"name":"x","arguments":{{"s":"{}\"{}"}}}}}}"#,
            "[".repeat(5_000),
            "{".repeat(10)
        );
        assert!(jsonrpc_envelope(quoted.as_bytes()).is_ok());
        for fine in [
            r#"{"jsonrpc":"2.0","id":"x","method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":-3,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ] {
            assert!(jsonrpc_envelope(fine.as_bytes()).is_ok(), "{fine}");
        }
    }
}
