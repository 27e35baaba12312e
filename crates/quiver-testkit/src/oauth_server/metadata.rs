//! The discovery documents: RFC 8414 authorization server metadata, OpenID
//! configuration and RFC 9728 protected resource metadata (each of which a
//! [`Fault`](super::Fault) can break).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::options::{ADMIN_SCOPE, Fault, SCOPE};
use super::state::Shared;
use crate::oidc_issuer::OPENID_SCOPE;

/// The issuer the `wrong-issuer` fault announces.
pub(super) const WRONG_ISSUER: &str = "http://issuer.invalid";

pub(super) async fn authorization_server_metadata(State(shared): State<Arc<Shared>>) -> Response {
    match metadata(&shared) {
        Some(metadata) => axum::Json(metadata).into_response(),
        None => bad_metadata(),
    }
}

/// OpenID discovery: the authorization server's metadata plus `jwks_uri`,
/// the signing algorithms and scope `openid` (counted as a discovery fetch).
pub(super) async fn openid_configuration(State(shared): State<Arc<Shared>>) -> Response {
    let oidc = shared.oidc.discovery_fields();
    match metadata(&shared) {
        Some(mut metadata) => {
            if let (Some(object), Value::Object(oidc)) = (metadata.as_object_mut(), oidc) {
                object.extend(oidc);
            }
            if let Some(scopes) = metadata["scopes_supported"].as_array_mut() {
                scopes.push(json!(OPENID_SCOPE));
            }
            axum::Json(metadata).into_response()
        }
        None => bad_metadata(),
    }
}

/// The [`Fault::BadMetadata`] answer: malformed JSON.
pub(super) fn bad_metadata() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        "{\"issuer\": 42",
    )
        .into_response()
}

/// The RFC 8414 metadata document (`None`: [`Fault::BadMetadata`]).
pub(super) fn metadata(shared: &Shared) -> Option<Value> {
    if shared.fault == Some(Fault::BadMetadata) {
        return None;
    }
    let base = &shared.issuer;
    let issuer = if shared.fault == Some(Fault::WrongIssuer) {
        WRONG_ISSUER
    } else {
        base
    };
    let mut metadata = json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{base}/authorize"),
        "token_endpoint": format!("{base}/token"),
        "registration_endpoint": format!("{base}/register"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
        "scopes_supported": [SCOPE, ADMIN_SCOPE],
        "client_id_metadata_document_supported": false,
    });
    if shared.fault == Some(Fault::NoPkce)
        && let Some(object) = metadata.as_object_mut()
    {
        object.remove("code_challenge_methods_supported");
    }
    Some(metadata)
}

pub(super) async fn protected_resource_metadata(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(json!({
        "resource": shared.resource,
        "authorization_servers": [shared.issuer],
        "scopes_supported": [SCOPE],
        "bearer_methods_supported": ["header"],
    }))
    .into_response()
}
