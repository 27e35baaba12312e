//! `DELETE /v1/sessions/{session_id}`: ends the caller's session on this
//! worker: the connections `isolation = "per_session"` servers hold for it
//! (docs/reference.md §13.1) are closed once their calls in flight are done,
//! their processes ended and reaped. Only the caller's own sessions (those
//! it named with `x-quiver-session` under its own token) can be ended;
//! another caller's session of the same name, and gateway sessions (ended
//! by the MCP session's DELETE), are not touched.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use quiver_mcp::leases::{SessionKey, SessionKind};
use quiver_model::ErrorCode;
use serde_json::json;

use crate::error::ErrorObject;
use crate::http::error::ApiError;
use crate::http::extract::{Caller, CallerKey};
use crate::http::state::ApiState;

/// The handler: 200 with the number of connections ended, 404 when the
/// caller has no such session here.
pub async fn end(
    Caller(task): Caller,
    CallerKey(caller): CallerKey,
    State(state): State<ApiState>,
    Path(session_id): Path<String>,
) -> Result<Response, ApiError> {
    let session = SessionKey {
        caller: caller.principal(),
        task: task.name.clone(),
        kind: SessionKind::Api,
        session_id,
    };
    let ended = state.runner.pool().end_session(&session);
    if ended == 0 {
        return Err(ErrorObject::new(
            ErrorCode::NotFound,
            format!(
                "no session {:?} of this caller holds a connection on this worker",
                session.session_id
            ),
        )
        .into());
    }
    Ok((
        StatusCode::OK,
        axum::Json(json!({"session_id": session.session_id, "connections_ended": ended})),
    )
        .into_response())
}
