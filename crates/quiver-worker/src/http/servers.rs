//! `GET /v1/mcp/servers`: per-server health and why selected servers are
//! unavailable (diagnostics), for the servers the caller's task may use.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::http::extract::Caller;
use crate::http::state::ApiState;

/// The handler.
pub async fn list(Caller(task): Caller, State(state): State<ApiState>) -> Response {
    let snapshot = state.snapshot.current();
    let health = state.runner.pool().health();
    let servers: Vec<Value> = snapshot
        .servers
        .values()
        .filter(|server| task.policy.allows_server(&server.spec.server_id))
        .map(|server| {
            let id = &server.spec.server_id;
            let health = health.iter().find(|h| &h.server_id == id);
            // The OAuth connection's status as this worker last saw it
            // (`not_used` before the first token request).
            let oauth = server.spec.http.as_ref().and_then(|http| http.auth_ref.as_ref()).map(|auth_ref| {
                let status = state.tokens.as_ref().and_then(|tokens| tokens.status(auth_ref));
                json!({"auth_ref": auth_ref, "status": status.map_or(json!("not_used"), |s| json!(s))})
            });
            json!({
                "server_id": id,
                "enabled": server.spec.enabled,
                "revision": server.revision,
                "state": health.map_or("idle", |h| crate::health::state_name(h.state)),
                // A server's stderr (and errors quoting its URL) may show
                // the record's secrets: callers read them redacted.
                "last_error": health.and_then(|h| h.last_error.as_deref()).map(|e| server.spec.redact(e)),
                "reconnects": health.map_or(0, |h| h.reconnects),
                "tool_count": health.and_then(|h| h.tool_count),
                "pid": health.and_then(|h| h.pid),
                // The protocol the live connection settled on (`null`
                // without one), as the record's `protocol` allowed.
                "protocol": server.spec.protocol.as_str(),
                "protocol_version": health.and_then(|h| h.protocol_version.as_deref()),
                "sessions": health.map_or(0, |h| h.sessions),
                "oauth": oauth,
                "stderr_tail": health.map_or_else(Vec::new, |h| {
                    h.stderr_tail.iter().map(|line| server.spec.redact(line)).collect()
                }),
            })
        })
        .collect();
    axum::Json(json!({"revision": snapshot.revision, "servers": servers})).into_response()
}
