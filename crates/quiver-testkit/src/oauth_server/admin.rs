//! `/admin/*`: what a test reads (counters, tokens issued) and changes
//! (expiry, revocation, token lifetime, auto user, clients).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::options::{MAX_ACCESS_TTL, MAX_ENTRIES, User};
use super::register::check_redirect_uris;
use super::state::{Client, Shared, TokenKind};
use super::wire::{OAuthFailure, full, invalid_request};

pub(super) const MAX_CLIENT_ID_LEN: usize = 256;

pub(super) async fn admin_stats(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(shared.stats()).into_response()
}

/// Every token issued so far, by kind, and `users`: each token's user
/// (test only: the server has no secrets worth keeping).
pub(super) async fn admin_tokens(State(shared): State<Arc<Shared>>) -> Response {
    let store = shared.store();
    let of = |kind: TokenKind| -> Vec<&str> {
        store
            .issued
            .iter()
            .filter(|issued| issued.kind == kind)
            .map(|issued| issued.token.as_str())
            .collect()
    };
    let users: serde_json::Map<String, Value> = store
        .issued
        .iter()
        .map(|issued| (issued.token.clone(), json!(issued.user.as_str())))
        .collect();
    axum::Json(json!({
        "access_tokens": of(TokenKind::Access),
        "refresh_tokens": of(TokenKind::Refresh),
        "users": users,
    }))
    .into_response()
}

pub(super) async fn admin_expire(State(shared): State<Arc<Shared>>) -> Response {
    shared.expire_access_tokens();
    axum::Json(json!({"expired": true})).into_response()
}

pub(super) async fn admin_revoke(State(shared): State<Arc<Shared>>) -> Response {
    shared.store().refresh.clear();
    axum::Json(json!({"revoked": true})).into_response()
}

/// The body of `POST /admin/config`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AdminConfig {
    pub(super) access_ttl_secs: u64,
}

pub(super) async fn admin_config(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    let config: AdminConfig = serde_json::from_slice(&body)
        .map_err(|err| invalid_request(format!("expected {{\"access_ttl_secs\": n}}: {err}")))?;
    if config.access_ttl_secs > MAX_ACCESS_TTL.as_secs() {
        return Err(invalid_request(format!(
            "access_ttl_secs is at most {}",
            MAX_ACCESS_TTL.as_secs()
        )));
    }
    shared.store().access_ttl = Duration::from_secs(config.access_ttl_secs);
    Ok(axum::Json(json!({"access_ttl_secs": config.access_ttl_secs})).into_response())
}

/// The body of `POST /admin/auto-user`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AdminAutoUser {
    pub(super) user: String,
}

/// Sets the user `/authorize` approves for without a consent page.
pub(super) async fn admin_auto_user(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    let request: AdminAutoUser = serde_json::from_slice(&body)
        .map_err(|err| invalid_request(format!("expected {{\"user\": string}}: {err}")))?;
    let user = User::new(request.user).map_err(|err| invalid_request(err.to_string()))?;
    let body = json!({"user": user.as_str()});
    shared.store().auto_user = user;
    Ok(axum::Json(body).into_response())
}

/// The body of `POST /admin/clients`: a public client (no secret, PKCE
/// only) under a client id the test chooses.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AdminClient {
    pub(super) client_id: String,
    pub(super) redirect_uris: Vec<String>,
}

/// Registers (or replaces) a public client with a fixed `client_id`.
pub(super) async fn admin_clients(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    let request: AdminClient = serde_json::from_slice(&body).map_err(|err| {
        invalid_request(format!(
            "expected {{\"client_id\": string, \"redirect_uris\": [string]}}: {err}"
        ))
    })?;
    let id = &request.client_id;
    if id.is_empty() || id.len() > MAX_CLIENT_ID_LEN || id.chars().any(char::is_control) {
        return Err(invalid_request(format!(
            "client_id: 1 to {MAX_CLIENT_ID_LEN} bytes without control characters"
        )));
    }
    check_redirect_uris(&request.redirect_uris)?;
    {
        let mut store = shared.store();
        if !store.clients.contains_key(id) && store.clients.len() >= MAX_ENTRIES {
            return Err(full("clients"));
        }
        store.clients.insert(
            id.clone(),
            Client {
                secret: None,
                redirect_uris: Some(request.redirect_uris.clone()),
            },
        );
    }
    Ok(axum::Json(json!({
        "client_id": request.client_id,
        "redirect_uris": request.redirect_uris,
        "token_endpoint_auth_method": "none",
    }))
    .into_response())
}
