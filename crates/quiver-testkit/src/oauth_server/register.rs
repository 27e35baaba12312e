//! Dynamic client registration (RFC 7591).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use url::Url;

use super::options::MAX_ENTRIES;
use super::state::{Client, Shared, random_token};
use super::wire::{OAuthFailure, full, oauth_error};

/// Most redirect URIs one dynamic registration may carry, and their length.
pub(super) const MAX_REDIRECT_URIS: usize = 16;
pub(super) const MAX_URI_LEN: usize = 2048;

/// The fields of an RFC 7591 registration request the server uses; others
/// are ignored, as §2 asks.
#[derive(Deserialize)]
pub(super) struct RegistrationRequest {
    pub(super) redirect_uris: Vec<String>,
    pub(super) token_endpoint_auth_method: Option<String>,
    pub(super) client_name: Option<String>,
    pub(super) grant_types: Option<Vec<String>>,
    pub(super) response_types: Option<Vec<String>>,
}

/// A client's `redirect_uris`: 1 to [`MAX_REDIRECT_URIS`] absolute URLs
/// without fragment (RFC 7591 §2, RFC 6749 §3.1.2).
pub(super) fn check_redirect_uris(uris: &[String]) -> Result<(), OAuthFailure> {
    let redirect_error = |description: String| {
        oauth_error(StatusCode::BAD_REQUEST, "invalid_redirect_uri", description)
    };
    if uris.is_empty() || uris.len() > MAX_REDIRECT_URIS {
        return Err(redirect_error(format!(
            "give 1 to {MAX_REDIRECT_URIS} redirect_uris, not {}",
            uris.len()
        )));
    }
    for uri in uris {
        let usable =
            uri.len() <= MAX_URI_LEN && Url::parse(uri).is_ok_and(|url| url.fragment().is_none());
        if !usable {
            return Err(redirect_error(format!(
                "redirect uri {uri:?} is not an absolute URL without fragment"
            )));
        }
    }
    Ok(())
}

pub(super) async fn register(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OAuthFailure> {
    let metadata_error = |description: String| {
        oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_client_metadata",
            description,
        )
    };
    let request: RegistrationRequest = serde_json::from_slice(&body)
        .map_err(|err| metadata_error(format!("the body is not a registration request: {err}")))?;
    check_redirect_uris(&request.redirect_uris)?;
    let method = request
        .token_endpoint_auth_method
        .unwrap_or_else(|| "client_secret_basic".to_owned());
    if !matches!(
        method.as_str(),
        "none" | "client_secret_post" | "client_secret_basic"
    ) {
        return Err(metadata_error(format!(
            "token_endpoint_auth_method {method:?} is not supported"
        )));
    }
    let client_id = format!("client-{}", random_token());
    let secret = (method != "none").then(random_token);
    {
        let mut store = shared.store();
        if store.clients.len() >= MAX_ENTRIES {
            return Err(full("clients"));
        }
        store.clients.insert(
            client_id.clone(),
            Client {
                secret: secret.clone(),
                redirect_uris: Some(request.redirect_uris.clone()),
            },
        );
        store.stats.registrations += 1;
    }
    let issued_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let mut response = json!({
        "client_id": client_id,
        "client_id_issued_at": issued_at,
        "redirect_uris": request.redirect_uris,
        "token_endpoint_auth_method": method,
        "grant_types": request.grant_types.unwrap_or_else(|| vec!["authorization_code".to_owned()]),
        "response_types": request.response_types.unwrap_or_else(|| vec!["code".to_owned()]),
    });
    if let Some(name) = request.client_name {
        response["client_name"] = Value::String(name);
    }
    if let Some(secret) = secret {
        response["client_secret"] = Value::String(secret);
        response["client_secret_expires_at"] = json!(0);
    }
    Ok((StatusCode::CREATED, axum::Json(response)).into_response())
}
