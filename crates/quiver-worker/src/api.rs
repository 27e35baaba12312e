//! The worker's HTTP surface: the direct tool API (R-CHAT-7, SPEC §15),
//! health, readiness and metrics.
//!
//! `GET /v1/mcp/tools[?server_ids=a,b]` lists what the caller may use;
//! `POST /v1/mcp/tools/call` `{name, arguments}` runs one tool under the same
//! policy and budgets as chat. Failures are the §10 error object
//! `{"error": {"code", "message", "retryable"}}` with a fitting status.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use quiver_mcp::McpError;
use quiver_model::policy::{SessionFilter, check_session_within_task};
use quiver_sync::SnapshotHandle;
use quiver_upstream::Upstream;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::{Callers, Task};
use crate::call::{CallContext, CallError, ToolCall, ToolRunner};

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The registry snapshot.
    pub snapshot: SnapshotHandle,
    /// Runs tools over the MCP pool.
    pub runner: ToolRunner,
    /// Caller credentials.
    pub callers: Arc<Callers>,
    /// The chat upstream, when configured.
    pub upstream: Option<Upstream>,
    /// Prometheus recorder, when installed.
    pub metrics: Option<PrometheusHandle>,
}

/// The header carrying a request's id, taken from the caller when it sends
/// a usable one and returned on every answer.
pub const REQUEST_ID: &str = "x-request-id";

/// The header naming the caller's session (audit).
pub const SESSION_ID: &str = "x-quiver-session";

/// The caller's request id if it is short printable ASCII, else a new one.
pub fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| format!("{:032x}", rand::random::<u128>()), str::to_owned)
}

/// The caller's session id, if it sent one.
pub fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= 256)
        .map(str::to_owned)
}

/// The router of the worker's HTTP listener.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/mcp/tools", get(list_tools))
        .route("/v1/mcp/tools/call", post(call))
        .route("/v1/chat/completions", post(crate::chat::chat_completions))
        .route("/v1/mcp/servers", get(servers))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
        .layer(tower_http::trace::TraceLayer::new_for_http())
}

/// A §10 error response.
pub fn error_response(
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
    retryable: bool,
) -> Response {
    (
        status,
        axum::Json(
            json!({"error": {"code": code, "message": message.into(), "retryable": retryable}}),
        ),
    )
        .into_response()
}

/// The authenticated caller of a request.
pub struct Caller(pub Task);

impl FromRequestParts<ApiState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ApiState,
    ) -> Result<Self, Self::Rejection> {
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        state
            .callers
            .authenticate(authorization)
            .map(Caller)
            .ok_or_else(|| {
                let mut response = error_response(
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    "missing or invalid bearer token",
                    false,
                );
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static("Bearer"),
                );
                response
            })
    }
}

#[derive(Deserialize)]
struct ToolsQuery {
    server_ids: Option<String>,
}

async fn list_tools(
    Caller(task): Caller,
    State(state): State<ApiState>,
    Query(query): Query<ToolsQuery>,
) -> Response {
    let session = SessionFilter {
        server_ids: query.server_ids.map(|ids| {
            ids.split(',')
                .filter(|id| !id.is_empty())
                .map(str::to_owned)
                .collect()
        }),
        ..Default::default()
    };
    let session = match session.compile() {
        Ok(session) => session,
        Err(err) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                err.to_string(),
                false,
            );
        }
    };
    if let Err(err) = check_session_within_task(&task.policy, &session) {
        return error_response(
            StatusCode::FORBIDDEN,
            quiver_mcp::ErrorCode::McpPolicyDenied.as_str(),
            err.to_string(),
            false,
        );
    }
    let snapshot = state.snapshot.current();
    let catalog = state
        .runner
        .catalog(&snapshot, &task, Some(&session), None)
        .await;
    let tools: Vec<Value> = catalog
        .tools()
        .map(|tool| {
            json!({
                "name": tool.injected_name,
                "server_id": tool.server_id(),
                "tool_name": tool.tool_name(),
                "description": tool.tool.description,
                "input_schema": tool.tool.input_schema,
            })
        })
        .collect();
    axum::Json(Value::Array(tools)).into_response()
}

async fn call(
    Caller(task): Caller,
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: ToolCall = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("body must be {{\"name\": string, \"arguments\": object}}: {err}"),
                false,
            );
        }
    };
    let started = Instant::now();
    let context = CallContext {
        request_id: request_id(&headers),
        session_id: session_id(&headers),
    };
    match state
        .runner
        .call(&state.snapshot.current(), &task, &context, &request)
        .await
    {
        Ok(done) => {
            let mut body =
                json!({"content": done.outcome.result.content, "is_error": done.is_error()});
            if let Some(structured) = &done.outcome.result.structured_content {
                body["structured_content"] = structured.clone();
            }
            if let Some(error) = done.error_object() {
                body["error"] = error;
            }
            if done.outcome.output.truncated() {
                body["truncated"] = json!(true);
            }
            axum::Json(body).into_response()
        }
        Err(err) => {
            // Argument errors may quote the caller's values (secrets among
            // them): their code is logged, their text only goes to the caller.
            let detail = match &err {
                CallError::InvalidArguments(_)
                | CallError::Mcp(McpError::InvalidArguments(_) | McpError::Protocol(_)) => None,
                other => Some(other.to_string()),
            };
            tracing::debug!(name = %request.name, elapsed_ms = started.elapsed().as_millis() as u64, code = err.code().as_str(), error = detail.as_deref(), "tool call failed");
            let status = match &err {
                CallError::PolicyDenied(_) | CallError::ApprovalRequired(_) => {
                    StatusCode::FORBIDDEN
                }
                CallError::InvalidArguments(_) => StatusCode::BAD_REQUEST,
                CallError::Mcp(McpError::Timeout(_)) => StatusCode::GATEWAY_TIMEOUT,
                CallError::Mcp(McpError::InvalidArguments(_)) => StatusCode::BAD_REQUEST,
                CallError::Mcp(McpError::EgressDenied(_)) => StatusCode::FORBIDDEN,
                CallError::Mcp(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            error_response(status, err.code().as_str(), err.to_string(), err.retryable())
        }
    }
}

/// Per-server health and why selected servers are unavailable (diagnostics).
async fn servers(Caller(task): Caller, State(state): State<ApiState>) -> Response {
    let snapshot = state.snapshot.current();
    let health = state.runner.pool().health();
    let servers: Vec<Value> = snapshot
        .servers
        .values()
        .filter(|server| task.policy.allows_server(&server.spec.server_id))
        .map(|server| {
            let id = &server.spec.server_id;
            let health = health.iter().find(|h| &h.server_id == id);
            json!({
                "server_id": id,
                "enabled": server.spec.enabled,
                "revision": server.revision,
                "state": health.map_or("idle", |h| crate::health::state_name(h.state)),
                "last_error": health.and_then(|h| h.last_error.clone()),
                "reconnects": health.map_or(0, |h| h.reconnects),
                "tool_count": health.and_then(|h| h.tool_count),
                "pid": health.and_then(|h| h.pid),
                "stderr_tail": health.map(|h| h.stderr_tail.clone()).unwrap_or_default(),
            })
        })
        .collect();
    axum::Json(json!({"revision": snapshot.revision, "servers": servers})).into_response()
}

async fn readyz(State(state): State<ApiState>) -> Response {
    let snapshot = state.snapshot.current();
    let body = json!({
        "ready": state.snapshot.is_ready(),
        "revision": snapshot.revision,
        "degraded": state.snapshot.is_degraded(),
        "last_error": state.snapshot.last_error(),
    });
    let status = if state.snapshot.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(state): State<ApiState>) -> Response {
    match &state.metrics {
        Some(handle) => {
            metrics::gauge!("mcp_child_processes")
                .set(state.runner.pool().child_processes() as f64);
            handle.render().into_response()
        }
        None => (StatusCode::NOT_FOUND, "metrics recorder not installed").into_response(),
    }
}
