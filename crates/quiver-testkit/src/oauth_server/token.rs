//! `/token`: client authentication and the three grants
//! (`authorization_code`, rotating `refresh_token`, `client_credentials`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::options::{Fault, SCOPE, User};
use super::state::{OAuthCaller, Shared};
use super::wire::{
    OAuthFailure, form_decode, invalid_client, invalid_grant, invalid_request, oauth_error,
    parse_params,
};
use crate::oidc_issuer::OPENID_SCOPE;

/// Whether `scope` (space-separated) only names scopes of `granted`.
pub(super) fn scope_within(scope: &str, granted: &str) -> bool {
    scope
        .split(' ')
        .filter(|s| !s.is_empty())
        .all(|s| granted.split(' ').any(|g| g == s))
}

/// The client a token request authenticates as.
pub(super) struct Authenticated {
    pub(super) id: String,
    pub(super) confidential: bool,
}

/// Client authentication at `/token`: HTTP Basic, `client_secret_post`, or
/// a public client's bare `client_id`.
pub(super) fn authenticate(
    shared: &Shared,
    headers: &HeaderMap,
    params: &HashMap<String, String>,
) -> Result<Authenticated, OAuthFailure> {
    let basic = match headers.get(header::AUTHORIZATION) {
        None => None,
        Some(value) => {
            let credentials = value
                .to_str()
                .ok()
                .and_then(|value| value.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
                .and_then(|(_, encoded)| STANDARD.decode(encoded.trim()).ok())
                .and_then(|decoded| String::from_utf8(decoded).ok())
                .and_then(|decoded| {
                    decoded
                        .split_once(':')
                        .map(|(id, secret)| (form_decode(id), form_decode(secret)))
                });
            match credentials {
                Some(credentials) => Some(credentials),
                None => {
                    return Err(invalid_request(
                        "the Authorization header is not HTTP Basic client credentials",
                    ));
                }
            }
        }
    };
    let form_id = params.get("client_id");
    let form_secret = params.get("client_secret");
    let (id, secret) = match basic {
        Some((id, secret)) => {
            if form_secret.is_some() {
                return Err(invalid_request(
                    "client authenticated both by HTTP Basic and client_secret",
                ));
            }
            if form_id.is_some_and(|form_id| *form_id != id) {
                return Err(invalid_request(
                    "client_id differs from the HTTP Basic user",
                ));
            }
            (id, Some(secret))
        }
        None => match form_id {
            Some(id) => (id.clone(), form_secret.cloned()),
            None => return Err(invalid_client("no client authentication")),
        },
    };
    let store = shared.store();
    let Some(client) = store.clients.get(&id) else {
        return Err(invalid_client(format!("unknown client {id:?}")));
    };
    match (&client.secret, &secret) {
        (Some(expected), Some(given)) if expected == given => Ok(Authenticated {
            id,
            confidential: true,
        }),
        (None, None) => Ok(Authenticated {
            id,
            confidential: false,
        }),
        (Some(_), _) => Err(invalid_client("wrong or missing client secret")),
        (None, Some(_)) => Err(invalid_client("a public client has no secret")),
    }
}

pub(super) async fn token(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    if shared.fault == Some(Fault::TokenError) {
        return Err(invalid_client("fault injected"));
    }
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value.split(';').next().is_some_and(|mime| {
                mime.trim()
                    .eq_ignore_ascii_case("application/x-www-form-urlencoded")
            })
        });
    if !form {
        return Err(invalid_request(
            "the body must be application/x-www-form-urlencoded",
        ));
    }
    let params = parse_params(&body)?;
    let client = authenticate(&shared, &headers, &params)?;
    let param = |name: &str| params.get(name).map(String::as_str);
    if let Some(resource) = param("resource")
        && resource != shared.resource
    {
        return Err(oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            format!("resource {resource:?} is not this server's protected resource"),
        ));
    }
    let (mut body, id_token) = match param("grant_type") {
        Some("authorization_code") => authorization_code_grant(&shared, &client, param)?,
        Some("refresh_token") => (refresh_grant(&shared, &client, param)?, None),
        Some("client_credentials") => (client_credentials_grant(&shared, &client, param)?, None),
        Some(other) => {
            return Err(oauth_error(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                format!("grant_type {other:?} is not supported"),
            ));
        }
        None => return Err(invalid_request("grant_type is missing")),
    };
    if let Some(IdTokenDue { nonce }) = id_token {
        // Signing fails only if key generation does: the access token
        // already issued is not taken back.
        let token = shared
            .oidc
            .id_token(&client.id, nonce.as_deref())
            .await
            .map_err(|err| {
                oauth_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    err.to_string(),
                )
            })?;
        body["id_token"] = Value::String(token);
    }
    Ok((
        [
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (header::PRAGMA, HeaderValue::from_static("no-cache")),
        ],
        axum::Json(body),
    )
        .into_response())
}

/// An `openid` code exchanged: the `id_token` to add to the response.
pub(super) struct IdTokenDue {
    /// The authorization request's `nonce`.
    pub(super) nonce: Option<String>,
}

/// The token response, and the `id_token` due when the code's scope has
/// `openid`.
pub(super) fn authorization_code_grant<'a>(
    shared: &Shared,
    client: &Authenticated,
    param: impl Fn(&str) -> Option<&'a str>,
) -> Result<(Value, Option<IdTokenDue>), OAuthFailure> {
    let (Some(code), Some(verifier), Some(redirect_uri)) =
        (param("code"), param("code_verifier"), param("redirect_uri"))
    else {
        return Err(invalid_request(
            "code, code_verifier and redirect_uri are required",
        ));
    };
    let now = Instant::now();
    let mut store = shared.store();
    // A code is spent by its first use, right or wrong (RFC 6749 §4.1.2).
    let Some(pending) = store.codes.remove(code) else {
        return Err(invalid_grant("unknown or used authorization code"));
    };
    if pending.expires <= now {
        return Err(invalid_grant("the authorization code has expired"));
    }
    if pending.caller.client_id != client.id {
        return Err(invalid_grant("the code was issued to another client"));
    }
    if pending.redirect_uri != redirect_uri {
        return Err(invalid_grant(
            "redirect_uri differs from the authorization request's",
        ));
    }
    if URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes())) != pending.challenge {
        return Err(invalid_grant(
            "code_verifier does not match the code_challenge",
        ));
    }
    let response = store.issue(&pending.caller, &pending.scope, true, now)?;
    store.stats.authorization_code_grants += 1;
    let id_token = scope_within(OPENID_SCOPE, &pending.scope).then_some(IdTokenDue {
        nonce: pending.nonce,
    });
    Ok((response, id_token))
}

pub(super) fn refresh_grant<'a>(
    shared: &Shared,
    client: &Authenticated,
    param: impl Fn(&str) -> Option<&'a str>,
) -> Result<Value, OAuthFailure> {
    let Some(refresh_token) = param("refresh_token") else {
        return Err(invalid_request("refresh_token is missing"));
    };
    let now = Instant::now();
    let mut store = shared.store();
    let owned = store
        .refresh
        .get(refresh_token)
        .is_some_and(|token| token.caller.client_id == client.id);
    let Some(old) = store.refresh.remove(refresh_token).filter(|_| owned) else {
        store.stats.refresh_failures += 1;
        return Err(invalid_grant(
            "unknown, used or revoked refresh token, or another client's",
        ));
    };
    let scope = match param("scope") {
        Some(scope) if !scope_within(scope, &old.scope) => {
            store.refresh.insert(refresh_token.to_owned(), old);
            return Err(oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_scope",
                "the scope exceeds the one originally granted",
            ));
        }
        Some(scope) if !scope.trim().is_empty() => scope.trim().to_owned(),
        _ => old.scope.clone(),
    };
    // The new tokens keep the user the old one was granted for.
    match store.issue(&old.caller, &scope, true, now) {
        Ok(response) => {
            store.count_refresh(&old.caller.user);
            Ok(response)
        }
        Err(response) => {
            // Nothing was issued: the old token stays usable.
            store.refresh.insert(refresh_token.to_owned(), old);
            Err(response)
        }
    }
}

pub(super) fn client_credentials_grant<'a>(
    shared: &Shared,
    client: &Authenticated,
    param: impl Fn(&str) -> Option<&'a str>,
) -> Result<Value, OAuthFailure> {
    if !client.confidential {
        return Err(oauth_error(
            StatusCode::BAD_REQUEST,
            "unauthorized_client",
            "client_credentials is for confidential clients",
        ));
    }
    let scope = param("scope")
        .map(str::trim)
        .filter(|scope| !scope.is_empty())
        .unwrap_or(SCOPE);
    // No person takes part: the client is its own user.
    let caller = OAuthCaller {
        client_id: client.id.clone(),
        user: User::client(&client.id),
    };
    let mut store = shared.store();
    let response = store.issue(&caller, scope, false, Instant::now())?;
    store.stats.client_credentials_grants += 1;
    Ok(response)
}
