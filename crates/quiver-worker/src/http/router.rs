//! The routes of the worker's HTTP listener and the layers around them.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{any, delete, get, post};

use crate::http::state::ApiState;
use crate::http::{artifacts, chat, fallback, grants, mcp, ops, servers, sessions, tools, whoami};
use crate::limits::MAX_REQUEST_BODY_BYTES;

/// The router of the worker's HTTP listener.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/mcp/tools", get(tools::list))
        .route("/v1/mcp/tools/call", post(tools::call))
        .route("/v1/mcp/servers", get(servers::list))
        .route("/v1/artifacts/{id}", get(artifacts::get))
        .route("/v1/sessions/{session_id}", delete(sessions::end))
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/whoami", get(whoami::whoami))
        .route("/v1/oauth/grants", get(grants::list))
        .route("/v1/oauth/grants/{connection}", delete(grants::revoke))
        .route("/mcp", any(mcp::catalog))
        .route("/mcp/{server_id}", any(mcp::server))
        .route(mcp::RESOURCE_METADATA_PATH, get(mcp::resource_metadata))
        .route(
            &format!("{}/mcp", mcp::RESOURCE_METADATA_PATH),
            get(mcp::resource_metadata),
        )
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .fallback(fallback::not_found)
        .method_not_allowed_fallback(fallback::method_not_allowed)
        .with_state(state)
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BODY_BYTES))
        .layer(tower_http::trace::TraceLayer::new_for_http())
}
