//! The worker's HTTP edge: the router, the extractors (caller, request id,
//! session id, body and query with JSON refusals), the one error response,
//! and the handlers, one module per resource:
//!
//! - [`tools`]: `GET /v1/mcp/tools`, `POST /v1/mcp/tools/call` (the direct
//!   tool API, docs/reference.md §15);
//! - [`chat`]: `POST /v1/chat/completions` (§9);
//! - [`servers`]: `GET /v1/mcp/servers` (per-server health);
//! - [`ops`]: `/healthz`, `/readyz`, `/metrics`.
//!
//! Every refusal, the framework's included (unknown route, wrong method,
//! body over [`MAX_REQUEST_BODY_BYTES`], a bad query string), is the JSON
//! error object of [`crate::error::ErrorObject`] with the status of its
//! [`quiver_mcp::ErrorCode`]. Handlers take the edge's [`extract`] types,
//! never axum's `Query`/`Json`/`Bytes`, whose refusals are plain text.
//!
//! The domain modules (`call`, `catalog`, `chat`) know nothing of HTTP: a
//! new endpoint is a handler module here plus a route in [`router`]; a new
//! failure is a row of the `ErrorCode` table and a `From` into
//! [`ErrorObject`](crate::error::ErrorObject).

pub mod chat;
pub mod error;
pub mod extract;
pub mod ops;
pub mod servers;
pub mod tools;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use quiver_mcp::ErrorCode;
use quiver_sync::SnapshotHandle;
use quiver_upstream::Upstream;

use crate::auth::Callers;
use crate::call::ToolRunner;
use crate::error::ErrorObject;
pub use error::ApiError;

/// The largest request body the worker reads (tool calls, chat requests).
pub const MAX_REQUEST_BODY_BYTES: usize = 2 * 1024 * 1024;

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

/// The router of the worker's HTTP listener.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/mcp/tools", get(tools::list))
        .route("/v1/mcp/tools/call", post(tools::call))
        .route("/v1/mcp/servers", get(servers::list))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BODY_BYTES))
        .layer(tower_http::trace::TraceLayer::new_for_http())
}

async fn not_found(uri: Uri) -> ApiError {
    ErrorObject::new(ErrorCode::NotFound, format!("no route {}", uri.path())).into()
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ErrorObject::new(
        ErrorCode::MethodNotAllowed,
        format!("{} does not accept {method}", uri.path()),
    )
    .into()
}
