//! The routes of the worker's HTTP listener and the layers around them.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::http::limits::MAX_REQUEST_BODY_BYTES;
use crate::http::state::ApiState;
use crate::http::{chat, fallback, ops, servers, tools};

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
        .fallback(fallback::not_found)
        .method_not_allowed_fallback(fallback::method_not_allowed)
        .with_state(state)
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BODY_BYTES))
        .layer(tower_http::trace::TraceLayer::new_for_http())
}
