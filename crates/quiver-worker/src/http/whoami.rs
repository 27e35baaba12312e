//! `GET /v1/whoami`: who the worker takes the caller for — its principal,
//! the policy (task) it gets, and how it authenticated.

use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::http::extract::Identified;

/// The handler: `{principal, policy, via}`.
pub async fn whoami(Identified(caller): Identified) -> Response {
    axum::Json(json!({
        "principal": caller.id.principal(),
        "policy": caller.task.name,
        "via": caller.via.as_str(),
    }))
    .into_response()
}
