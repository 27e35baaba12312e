//! What handlers take from a request: the authenticated caller, the request
//! and session ids, and the body and query string with refusals in the JSON
//! error shape (axum's own extractors refuse in plain text).

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

use crate::auth::{Authenticated, CallerId, Refusal, Task};
use crate::error::ErrorObject;
use crate::http::error::ApiError;
use crate::http::state::ApiState;

/// The header carrying a request's id, taken from the caller when it sends
/// a usable one.
pub const REQUEST_ID: &str = "x-request-id";

/// The header naming the caller's session (audit).
pub const SESSION_ID: &str = "x-quiver-session";

/// The authenticated caller of a request: the task its bearer token (a
/// configured token or an identity provider's JWT, or `--insecure-no-auth`)
/// selects. Refused with 401 `unauthenticated` (saying why) and
/// `WWW-Authenticate: Bearer`, or 403 `identity_no_matching_rule`.
pub struct Caller(pub Task);

impl FromRequestParts<ApiState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let caller = identify(state, &parts.headers).await?;
        parts.extensions.insert(caller.id);
        Ok(Caller(caller.task))
    }
}

/// The whole authenticated caller (task, credential, how), refused like
/// [`Caller`].
pub struct Identified(pub Authenticated);

impl FromRequestParts<ApiState> for Identified {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        identify(state, &parts.headers).await.map(Identified)
    }
}

/// The caller of a request with `headers`, refused like [`Caller`].
pub async fn identify(state: &ApiState, headers: &HeaderMap) -> Result<Authenticated, ApiError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    state
        .callers
        .identify(authorization)
        .await
        .map_err(|refusal| refused(&refusal))
}

/// The error of a refused caller.
pub fn refused(refusal: &Refusal) -> ApiError {
    ErrorObject::new(refusal.code(), refusal.message()).into()
}

/// Which credential the caller presented (the owner of its artifacts);
/// refused like [`Caller`]. Taken after [`Caller`], it reuses its answer.
pub struct CallerKey(pub CallerId);

impl FromRequestParts<ApiState> for CallerKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        if let Some(id) = parts.extensions.get::<CallerId>() {
            return Ok(CallerKey(id.clone()));
        }
        caller_key(state, &parts.headers).await.map(CallerKey)
    }
}

/// The credential of a request with `headers`, refused like [`Caller`].
pub async fn caller_key(state: &ApiState, headers: &HeaderMap) -> Result<CallerId, ApiError> {
    identify(state, headers).await.map(|caller| caller.id)
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

/// The raw request body, at most [`crate::limits::MAX_REQUEST_BODY_BYTES`]
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
