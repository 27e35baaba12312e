//! Answers for requests no route takes: the JSON error object, not axum's
//! empty 404/405.

use axum::http::{Method, Uri};
use quiver_model::ErrorCode;

use crate::error::ErrorObject;
use crate::http::error::ApiError;

/// No route has this path.
pub async fn not_found(uri: Uri) -> ApiError {
    ErrorObject::new(ErrorCode::NotFound, format!("no route {}", uri.path())).into()
}

/// The path exists with other methods (axum adds the `Allow` header).
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ErrorObject::new(
        ErrorCode::MethodNotAllowed,
        format!("{} does not accept {method}", uri.path()),
    )
    .into()
}
