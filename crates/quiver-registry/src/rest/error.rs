//! The admin API's refusals that no handler answers — an unknown route, a
//! method a route does not have, a body over the limit, an extractor's
//! rejection — as the same JSON error object as every other.

use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use crate::error::RegistryError;
use crate::rest::limits::MAX_BODY_BYTES;

pub(super) async fn unknown_route(uri: Uri) -> RegistryError {
    RegistryError::NotFound(format!("no admin API route {}", uri.path()))
}

pub(super) async fn method_not_allowed(method: Method, uri: Uri) -> RegistryError {
    RegistryError::MethodNotAllowed(format!(
        "admin API route {} does not take {method}",
        uri.path()
    ))
}

/// Turns a refusal the framework answered in plain text (a body over
/// [`MAX_BODY_BYTES`], a rejected extractor) into the JSON error object;
/// everything else passes unchanged.
pub(super) async fn json_refusals(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return RegistryError::PayloadTooLarge(format!(
            "request body is larger than the {} MiB limit of the admin API",
            MAX_BODY_BYTES / (1024 * 1024)
        ))
        .into_response();
    }
    // Rejection texts are short; a longer body is cut, not buffered whole.
    let text = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .map(|body| String::from_utf8_lossy(&body).into_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("refused")
            .to_lowercase()
    } else {
        text.to_lowercase()
    };
    match status {
        StatusCode::NOT_FOUND => RegistryError::NotFound(message),
        StatusCode::METHOD_NOT_ALLOWED => RegistryError::MethodNotAllowed(message),
        s if s.is_client_error() => RegistryError::InvalidArgument {
            field: None,
            message,
        },
        _ => RegistryError::Internal(message),
    }
    .into_response()
}
