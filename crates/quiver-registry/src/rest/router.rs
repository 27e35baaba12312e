//! The routes of the admin API and the layers around them.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::rest::error::{json_refusals, method_not_allowed, unknown_route};
use crate::rest::limits::MAX_BODY_BYTES;
use crate::rest::{
    access, apply, approvals, audit, import, oauth, record_defaults, rescan, server_json, servers,
    tool_preview, usage, whoami, workers,
};
use crate::state::RegistryState;

/// Routes of the admin API, to be nested at `/admin/api`.
pub fn router() -> Router<RegistryState> {
    Router::new()
        .route("/whoami", get(whoami::whoami))
        .route("/record-defaults", get(record_defaults::record_defaults))
        .route("/mcp/servers", get(servers::list).post(servers::upsert))
        .route(
            "/mcp/servers/{id}",
            get(servers::get).delete(servers::delete),
        )
        .route("/mcp/servers/{id}/history", get(servers::history))
        .route("/mcp/servers/{id}/rollback", post(servers::rollback))
        .route("/mcp/import", post(import::import))
        .route("/servers/apply", post(apply::apply))
        .route("/mcp/rescan", post(rescan::rescan))
        .route("/mcp/preview", post(tool_preview::preview))
        .route("/mcp/evaluate", post(tool_preview::evaluate))
        .route("/workers", get(workers::list))
        .route("/audit", get(audit::audit))
        .merge(approvals::router())
        .merge(access::router())
        .merge(oauth::router())
        .merge(usage::router())
        .merge(server_json::router())
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::map_response(json_refusals))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}
