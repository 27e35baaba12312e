//! The OAuth wire format: form-encoded request bodies in, RFC 6749 error
//! objects out.

use std::collections::HashMap;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::options::MAX_ENTRIES;

/// Largest request body of the authorization server's endpoints.
pub(super) const MAX_BODY_BYTES: usize = 64 * 1024;

/// An OAuth error answer (RFC 6749 §5.2 shape); small, unlike a
/// `Response`, so it can be the error of every step's `Result`.
pub(super) struct OAuthFailure {
    pub(super) status: StatusCode,
    pub(super) error: &'static str,
    pub(super) description: String,
}

impl IntoResponse for OAuthFailure {
    fn into_response(self) -> Response {
        let body = json!({"error": self.error, "error_description": self.description});
        let mut response = (
            self.status,
            [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
            axum::Json(body),
        )
            .into_response();
        // RFC 6749 §5.2: a 401 answers a failed client authentication.
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"token\""),
            );
        }
        response
    }
}

pub(super) fn oauth_error(
    status: StatusCode,
    error: &'static str,
    description: impl Into<String>,
) -> OAuthFailure {
    OAuthFailure {
        status,
        error,
        description: description.into(),
    }
}

pub(super) fn invalid_request(description: impl Into<String>) -> OAuthFailure {
    oauth_error(StatusCode::BAD_REQUEST, "invalid_request", description)
}

pub(super) fn invalid_grant(description: impl Into<String>) -> OAuthFailure {
    oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", description)
}

pub(super) fn invalid_client(description: impl Into<String>) -> OAuthFailure {
    oauth_error(StatusCode::UNAUTHORIZED, "invalid_client", description)
}

/// A table at [`MAX_ENTRIES`].
pub(super) fn full(what: &str) -> OAuthFailure {
    oauth_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        format!("the server holds {MAX_ENTRIES} {what}, its limit"),
    )
}

/// `application/x-www-form-urlencoded` parameters; a repeated one is an
/// error (RFC 6749 §3.1).
pub(super) fn parse_params(encoded: &[u8]) -> Result<HashMap<String, String>, OAuthFailure> {
    let mut params = HashMap::new();
    for (name, value) in url::form_urlencoded::parse(encoded) {
        if params
            .insert(name.to_string(), value.into_owned())
            .is_some()
        {
            return Err(invalid_request(format!(
                "parameter {name:?} given more than once"
            )));
        }
    }
    Ok(params)
}

/// `application/x-www-form-urlencoded` decoding of one value (the encoding
/// of HTTP Basic client credentials, RFC 6749 §2.3.1).
pub(super) fn form_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' => decoded.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    decoded.push((high * 16 + low) as u8);
                    i += 2;
                }
                _ => decoded.push(b'%'),
            },
            byte => decoded.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&decoded).into_owned()
}
