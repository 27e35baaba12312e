//! Operations endpoints, unauthenticated: `/healthz` (the process answers),
//! `/readyz` (a registry snapshot is loaded) and `/metrics` (Prometheus).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use quiver_model::ErrorCode;
use serde_json::json;

use crate::error::ErrorObject;
use crate::http::error::ApiError;
use crate::http::state::ApiState;

/// `GET /healthz`.
pub async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: 200 once the first snapshot is loaded, else 503.
pub async fn readyz(State(state): State<ApiState>) -> Response {
    let snapshot = state.snapshot.current();
    let body = json!({
        "ready": state.snapshot.is_ready(),
        "revision": snapshot.revision,
        "degraded": state.snapshot.is_degraded(),
        "registry": state.snapshot.registry(),
        "last_error": state.snapshot.last_error(),
    });
    let status = if state.snapshot.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// `GET /metrics`: the Prometheus text format, 404 without a recorder.
pub async fn metrics(State(state): State<ApiState>) -> Result<String, ApiError> {
    let handle = state
        .metrics
        .as_ref()
        .ok_or_else(|| ErrorObject::new(ErrorCode::NotFound, "metrics recorder not installed"))?;
    metrics::gauge!("mcp_child_processes").set(state.runner.pool().child_processes() as f64);
    Ok(handle.render())
}
