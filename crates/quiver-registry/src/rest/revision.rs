//! A record's revision over HTTP: the `ETag` of a response and the
//! precondition of a write (`?expected_revision=N` or `If-Match`).

use std::collections::HashMap;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::error::RegistryError;

/// `?expected_revision=N` or `If-Match: "N"`; the query string wins.
pub(crate) fn expected_revision(
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Option<u64>, RegistryError> {
    if let Some(value) = query.get("expected_revision") {
        return value.parse().map(Some).map_err(|_| {
            RegistryError::invalid(
                "expected_revision",
                format!("{value:?} is not a revision number"),
            )
        });
    }
    match headers.get(header::IF_MATCH) {
        None => Ok(None),
        Some(value) => {
            let text = value.to_str().unwrap_or_default().trim();
            let text = text.strip_prefix("W/").unwrap_or(text).trim_matches('"');
            text.parse().map(Some).map_err(|_| {
                RegistryError::invalid("If-Match", format!("{text:?} is not a revision number"))
            })
        }
    }
}

/// `body` as JSON with `status` and the revision as its `ETag` (`"N"`).
pub(crate) fn with_etag(status: StatusCode, revision: u64, body: Value) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{revision}\"")) {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}
