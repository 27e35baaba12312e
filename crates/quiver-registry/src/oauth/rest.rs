//! The OAuth connections over REST: `GET /admin/api/oauth/connections` and
//! `GET /admin/api/oauth/connections/{name}` (status, never a secret: the
//! viewer, editor and admin roles), `PUT|DELETE
//! /admin/api/oauth/connections/{name}` and `POST
//! /admin/api/oauth/connections/{name}/connect` (admin only); and the browser's way back
//! from the authorization server, `GET /admin/oauth/callback`, which needs no
//! token: it carries the flow's one-time `state` instead, and completes only
//! in the browser that pressed Connect (the flow's cookie, set by Connect).

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::broker::{CallbackParams, ConnectOutcome};
use super::spec::OAuthConnectionSpec;
use crate::error::RegistryError;
use crate::rest::{Caller, RequireAdmin, RequireViewer};
use crate::state::RegistryState;

/// The admin API routes, below `/admin/api`.
pub fn router() -> Router<RegistryState> {
    Router::new()
        .route("/oauth/connections", get(list))
        .route(
            "/oauth/connections/{name}",
            get(show).put(put).delete(delete),
        )
        .route("/oauth/connections/{name}/connect", post(connect))
}

async fn list(
    _: RequireViewer,
    State(state): State<RegistryState>,
) -> Result<Response, RegistryError> {
    let connections = state.oauth.list().await?;
    Ok(axum::Json(json!({ "connections": connections })).into_response())
}

async fn show(
    _: RequireViewer,
    State(state): State<RegistryState>,
    Path(name): Path<String>,
) -> Result<Response, RegistryError> {
    Ok(axum::Json(state.oauth.view(&name).await?).into_response())
}

async fn put(
    RequireAdmin(Caller { actor, .. }): RequireAdmin,
    State(state): State<RegistryState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, RegistryError> {
    let spec = OAuthConnectionSpec::from_json(&body)?;
    Ok(axum::Json(state.oauth.put(&name, spec, &actor).await?).into_response())
}

async fn delete(
    RequireAdmin(Caller { actor, .. }): RequireAdmin,
    State(state): State<RegistryState>,
    Path(name): Path<String>,
) -> Result<Response, RegistryError> {
    state.oauth.delete(&name, &actor).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn connect(
    RequireAdmin(Caller { actor, .. }): RequireAdmin,
    State(state): State<RegistryState>,
    Path(name): Path<String>,
) -> Result<Response, RegistryError> {
    Ok(match state.oauth.connect(&name, &actor).await? {
        // The browser that pressed Connect gets the flow's cookie; only it
        // can complete the flow at the callback.
        ConnectOutcome::Redirect { url, cookie } => (
            [(header::SET_COOKIE, cookie.header_value())],
            axum::Json(json!({ "authorization_url": url })),
        )
            .into_response(),
        ConnectOutcome::Connected(view) => {
            axum::Json(json!({ "connection": view })).into_response()
        }
    })
}

/// `GET /admin/oauth/callback`: on success back to the web admin's OAuth
/// page; on failure a page naming the failed step (nothing was stored).
pub async fn callback(
    State(state): State<RegistryState>,
    headers: axum::http::HeaderMap,
    params: Result<Query<CallbackParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = match params {
        Ok(Query(params)) => {
            state
                .oauth
                .callback(params, |name| crate::signin::cookie_value(&headers, name))
                .await
        }
        Err(err) => Err(RegistryError::InvalidArgument {
            field: None,
            message: format!("oauth callback: malformed query: {err}"),
        }),
    };
    match result {
        Ok(name) => (
            StatusCode::SEE_OTHER,
            [
                (
                    header::LOCATION,
                    format!("/admin/oauth?connected={}", url_component(&name)),
                ),
                // The flow is done: its cookie is of no further use.
                (
                    header::SET_COOKIE,
                    format!(
                        "{}=; Path={}; Max-Age=0; HttpOnly; SameSite=Lax",
                        super::broker::FlowCookie::name_for(&name),
                        super::broker::CALLBACK_PATH
                    ),
                ),
            ],
        )
            .into_response(),
        Err(err) => {
            let status = err.code().http();
            let page = format!(
                "<!doctype html><meta charset=\"utf-8\"><title>OAuth connection failed</title>\
                 <h1>OAuth connection failed</h1><p id=\"oauth-error\">{}</p>\
                 <p><a href=\"/admin/oauth\">Back to the OAuth connections</a></p>",
                html_escaped(&err.to_string())
            );
            (
                status,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                page,
            )
                .into_response()
        }
    }
}

fn url_component(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn html_escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
