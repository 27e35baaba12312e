//! A caller's own grants of per-user OAuth connections (docs/reference.md
//! R-OAUTH-8): `GET /v1/oauth/grants` lists them (never a token) and
//! `DELETE /v1/oauth/grants/{connection}` revokes one. Both act on the
//! caller's own principal only, asked of the registry; a revocation also
//! ends this worker's connections carrying the grant at once (other workers
//! stop within the registry's recheck bound).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use quiver_model::ErrorCode;
use serde_json::json;

use crate::error::ErrorObject;
use crate::http::error::ApiError;
use crate::http::extract::CallerKey;
use crate::http::state::ApiState;
use crate::oauth_tokens::TokenCache;

/// The caller's principal and the registry's token service, or why not.
fn principal_and_tokens(
    state: &ApiState,
    caller: &crate::auth::CallerId,
) -> Result<(String, TokenCache), ApiError> {
    let principal = caller.grant_principal().ok_or_else(|| {
        ErrorObject::new(
            ErrorCode::InvalidRequest,
            "an anonymous caller holds no grants: present a credential",
        )
    })?;
    let tokens = state.tokens.clone().ok_or_else(|| {
        ErrorObject::new(
            ErrorCode::McpUnavailable,
            "this worker follows no registry, which holds the grants",
        )
    })?;
    Ok((principal, tokens))
}

fn unreachable(err: quiver_sync::SyncError) -> ApiError {
    ErrorObject::new(
        ErrorCode::McpUnavailable,
        format!("the registry did not answer: {err}"),
    )
    .into()
}

/// `GET /v1/oauth/grants`: `{"grants": [{connection, status, expires_at_ms,
/// connected_at_ms, refresh_count, last_error}]}`.
pub async fn list(
    CallerKey(caller): CallerKey,
    State(state): State<ApiState>,
) -> Result<Response, ApiError> {
    let (principal, tokens) = principal_and_tokens(&state, &caller)?;
    let grants = tokens
        .registry()
        .grants(&principal)
        .await
        .map_err(unreachable)?;
    Ok(axum::Json(json!({ "principal": principal, "grants": grants })).into_response())
}

/// `DELETE /v1/oauth/grants/{connection}`: 204, or 404 when the caller has
/// no grant of it.
pub async fn revoke(
    CallerKey(caller): CallerKey,
    State(state): State<ApiState>,
    Path(connection): Path<String>,
) -> Result<Response, ApiError> {
    let (principal, tokens) = principal_and_tokens(&state, &caller)?;
    let revoked = tokens
        .registry()
        .revoke_grant(&connection, &principal)
        .await
        .map_err(unreachable)?;
    // Whatever the registry held, nothing here carries it any more.
    tokens.forget(&connection, &principal);
    state.runner.pool().end_grant(&principal, &connection);
    if !revoked {
        return Err(ErrorObject::new(
            ErrorCode::NotFound,
            format!("{principal} has no grant of oauth connection {connection:?}"),
        )
        .into());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}
