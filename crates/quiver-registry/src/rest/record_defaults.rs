//! `GET /record-defaults`: the values the registry gives a record's fields
//! when the record leaves them out, from the model's `Default`s, so the web
//! admin shows them without a copy of its own.

use axum::response::{IntoResponse, Response};
use quiver_model::Budgets;
use serde_json::json;

use crate::rest::extract::RequireReader;

/// `{"budgets": {...}}`: the defaults of every field that has one (a field
/// whose default is "unset", such as `budgets.session_idle_ms`, is absent).
pub(super) async fn record_defaults(RequireReader(_): RequireReader) -> Response {
    axum::Json(json!({ "budgets": Budgets::default() })).into_response()
}
