//! What handlers take from a request: the authenticated caller, the request
//! and session ids, and the body and query string with refusals in the JSON
//! error shape (axum's own extractors refuse in plain text).

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use quiver_mcp::ErrorCode;

use crate::auth::{CallerId, Task};
use crate::error::ErrorObject;
use crate::http::error::ApiError;
use crate::http::state::ApiState;

/// The header carrying a request's id, taken from the caller when it sends
/// a usable one.
pub const REQUEST_ID: &str = "x-request-id";

/// The header naming the caller's session (audit).
pub const SESSION_ID: &str = "x-quiver-session";

/// The authenticated caller of a request: the task its bearer token (or
/// `--insecure-no-auth`) selects. Refused with 401 `unauthenticated` and
/// `WWW-Authenticate: Bearer`.
pub struct Caller(pub Task);

impl FromRequestParts<ApiState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let (task, id) = state
            .callers
            .identify(authorization)
            .ok_or_else(unauthenticated)?;
        parts.extensions.insert(id);
        Ok(Caller(task))
    }
}

fn unauthenticated() -> ApiError {
    ErrorObject::new(
        ErrorCode::Unauthenticated,
        "missing or invalid bearer token",
    )
    .into()
}

/// Which credential the caller presented (the owner of its artifacts);
/// refused like [`Caller`]. Taken after [`Caller`], it reuses its answer.
pub struct CallerKey(pub CallerId);

impl FromRequestParts<ApiState> for CallerKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        if let Some(id) = parts.extensions.get::<CallerId>() {
            return Ok(CallerKey(*id));
        }
        caller_key(state, &parts.headers).map(CallerKey)
    }
}

/// The credential of a request with `headers`, refused like [`Caller`].
pub fn caller_key(state: &ApiState, headers: &HeaderMap) -> Result<CallerId, ApiError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    state
        .callers
        .identify(authorization)
        .map(|(_, id)| id)
        .ok_or_else(unauthenticated)
}

/// The request's id: the caller's `x-request-id` if it is short printable
/// ASCII, else a new random one.
pub struct RequestId(pub String);

impl RequestId {
    /// The id of a request with `headers`.
    pub fn of(headers: &HeaderMap) -> String {
        headers
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|id| {
                !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic())
            })
            .map_or_else(|| format!("{:032x}", rand::random::<u128>()), str::to_owned)
    }
}

impl<S: Sync> FromRequestParts<S> for RequestId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(RequestId(RequestId::of(&parts.headers)))
    }
}

/// The caller's session id (`x-quiver-session`, at most 256 bytes), if it
/// sent one.
pub struct SessionId(pub Option<String>);

impl<S: Sync> FromRequestParts<S> for SessionId {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(SessionId(
            parts
                .headers
                .get(SESSION_ID)
                .and_then(|v| v.to_str().ok())
                .filter(|id| !id.is_empty() && id.len() <= 256)
                .map(str::to_owned),
        ))
    }
}

/// The raw request body, at most [`crate::http::MAX_REQUEST_BODY_BYTES`]
/// (413 `payload_too_large` beyond).
pub struct Body(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        Ok(Body(Bytes::from_request(request, state).await?))
    }
}

/// The query string deserialized into `T` (400 `invalid_request` for a
/// malformed or repeated parameter).
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);
