//! The one error response of the edge: an [`ErrorObject`] with the HTTP
//! status of its code ([`http_status`], the one place a code becomes a
//! status), refusals of the framework's extractors included.

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use quiver_model::ErrorCode;

use crate::error::ErrorObject;
use crate::limits::MAX_REQUEST_BODY_BYTES;

/// The HTTP status a request failing with `code` is answered with
/// (docs/reference.md §10.1). A call that did answer is a 200 whatever its
/// error object says (a truncated output carries `mcp_output_too_large`, an
/// `isError` result `mcp_tool_error`); `mcp_output_too_large` as a failure
/// is an answer the worker could not take at all (over
/// `max_message_bytes`): 502.
pub const fn http_status(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::McpUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::McpTimeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorCode::McpInvalidArguments => StatusCode::BAD_REQUEST,
        ErrorCode::McpPolicyDenied => StatusCode::FORBIDDEN,
        ErrorCode::McpOutputTooLarge => StatusCode::BAD_GATEWAY,
        ErrorCode::McpApprovalRequired => StatusCode::FORBIDDEN,
        ErrorCode::McpAuthorizationRequired => StatusCode::FORBIDDEN,
        ErrorCode::McpApprovalDenied => StatusCode::FORBIDDEN,
        ErrorCode::McpApprovalInvalid => StatusCode::FORBIDDEN,
        ErrorCode::McpToolError => StatusCode::OK,
        ErrorCode::McpInputRequired => StatusCode::CONFLICT,
        ErrorCode::McpBudgetExceeded => StatusCode::FORBIDDEN,
        ErrorCode::McpRateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::IdentityNoMatchingRule => StatusCode::FORBIDDEN,
        ErrorCode::ForbiddenOrigin => StatusCode::FORBIDDEN,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::UpstreamNotConfigured => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::UpstreamRejected => StatusCode::BAD_GATEWAY,
        ErrorCode::UpstreamFailed => StatusCode::BAD_GATEWAY,
        ErrorCode::UpstreamUnavailable => StatusCode::BAD_GATEWAY,
        ErrorCode::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorCode::UpstreamInvalidResponse => StatusCode::BAD_GATEWAY,
        ErrorCode::UpstreamStreamFailed => StatusCode::BAD_GATEWAY,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error answer: the body of [`ErrorObject::to_body`] with a status.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status: the code's own, or the one the framework chose for
    /// a refusal of its extractors.
    pub status: StatusCode,
    /// The body.
    pub object: ErrorObject,
}

impl From<ErrorObject> for ApiError {
    fn from(object: ErrorObject) -> Self {
        ApiError {
            status: http_status(object.code),
            object,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let unauthenticated = self.object.code == ErrorCode::Unauthenticated;
        // A refusal that knows when to try again says it in whole seconds,
        // rounded up (RFC 9110 §10.2.3).
        let retry_after = self
            .object
            .extra
            .get("retry_after_ms")
            .and_then(serde_json::Value::as_u64)
            .map(|ms| ms.div_ceil(1000).max(1));
        let mut response = (self.status, axum::Json(self.object.to_body())).into_response();
        if unauthenticated {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// A refusal of one of axum's extractors, as the error object: the status
/// axum chose, a code that fits it, and axum's explanation.
fn refusal(status: StatusCode, text: String) -> ApiError {
    let (code, message) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (
            ErrorCode::PayloadTooLarge,
            format!("request body is over the limit of {MAX_REQUEST_BODY_BYTES} bytes"),
        ),
        _ => (ErrorCode::InvalidRequest, lowercase(text)),
    };
    ApiError {
        status,
        object: ErrorObject::new(code, message),
    }
}

/// axum capitalizes its messages; the worker's are lowercase.
fn lowercase(text: String) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        refusal(rejection.status(), rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        refusal(rejection.status(), rejection.body_text())
    }
}
