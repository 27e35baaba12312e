//! The OAuth connections over REST (the connections and their flows are
//! [`crate::oauth`]'s): `GET /admin/api/oauth/connections` and
//! `GET /admin/api/oauth/connections/{name}` (status, never a secret: the
//! viewer, editor and admin roles), `PUT|DELETE
//! /admin/api/oauth/connections/{name}` and `POST
//! /admin/api/oauth/connections/{name}/connect` (admin only); principals'
//! grants of per-user connections, `GET
//! /admin/api/oauth/connections/{name}/grants` (viewer and up) and `DELETE
//! …/grants/{principal}` (admin); and the browser's ways, which need no
//! token: a consent link `GET /oauth/authorize/{secret}` (the link's
//! one-time secret instead: it starts its principal's flow, binding it to
//! the browser by the flow's cookie), the way back from the authorization
//! server `GET /admin/oauth/callback` (the flow's one-time `state`;
//! completes only in the browser that pressed Connect or followed the link),
//! and `GET /oauth/connected`, the page a person lands on after consenting.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::error::RegistryError;
use crate::oauth::broker::{CALLBACK_PATH, CallbackParams, ConnectOutcome, FlowCookie};
use crate::oauth::spec::OAuthConnectionSpec;
use crate::rest::extract::{Caller, RequireAdmin, RequireViewer};
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
        .route("/oauth/connections/{name}/grants", get(grants))
        .route(
            "/oauth/connections/{name}/grants/{principal}",
            axum::routing::delete(revoke_grant),
        )
}

async fn grants(
    _: RequireViewer,
    State(state): State<RegistryState>,
    Path(name): Path<String>,
) -> Result<Response, RegistryError> {
    let grants = state.oauth.grants(Some(&name), None).await?;
    Ok(axum::Json(json!({ "grants": grants })).into_response())
}

async fn revoke_grant(
    RequireAdmin(Caller { actor, .. }): RequireAdmin,
    State(state): State<RegistryState>,
    Path((name, principal)): Path<(String, String)>,
) -> Result<Response, RegistryError> {
    state.oauth.revoke_grant(&name, &principal, &actor).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
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

/// The browser's ways, outside the admin API: the authorization server's
/// way back, consent links and the page after consenting.
pub fn oauth_pages() -> Router<RegistryState> {
    Router::new()
        .route(CALLBACK_PATH, get(callback))
        .route("/oauth/authorize/{secret}", get(follow_link))
        .route("/oauth/connected", get(connected))
}

/// `GET /admin/oauth/callback`: on success back to the web admin's OAuth
/// page; on failure a page naming the failed step (nothing was stored).
async fn callback(
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
        Ok(authorized) => {
            // A principal's consent lands on a page for anyone; an admin's
            // Connect back on the web admin.
            let location = match &authorized.principal {
                Some(_) => format!(
                    "/oauth/connected?connection={}",
                    url_component(&authorized.connection)
                ),
                None => format!(
                    "/admin/oauth?connected={}",
                    url_component(&authorized.connection)
                ),
            };
            (
                StatusCode::SEE_OTHER,
                [
                    (header::LOCATION, location),
                    // The flow is done: its cookie is of no further use.
                    (
                        header::SET_COOKIE,
                        format!(
                            "{}=; Path={}; Max-Age=0; HttpOnly; SameSite=Lax",
                            FlowCookie::name_for(&authorized.connection),
                            CALLBACK_PATH
                        ),
                    ),
                ],
            )
                .into_response()
        }
        Err(err) => failure_page(&err),
    }
}

/// `GET /oauth/authorize/{secret}`: a consent link's first visit sends the
/// browser on to the authorization server (with the flow's cookie); any
/// other visit gets a page naming the step.
async fn follow_link(State(state): State<RegistryState>, Path(secret): Path<String>) -> Response {
    match state.oauth.follow_link(&secret).await {
        Ok(ConnectOutcome::Redirect { url, cookie }) => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, url),
                (header::SET_COOKIE, cookie.header_value()),
            ],
        )
            .into_response(),
        Ok(ConnectOutcome::Connected(_)) => failure_page(&RegistryError::Internal(
            "a consent link connected without a person".into(),
        )),
        Err(err) => failure_page(&err),
    }
}

/// `GET /oauth/connected?connection=…`: where a person lands after
/// consenting through a link.
async fn connected(Query(query): Query<std::collections::HashMap<String, String>>) -> Response {
    let connection = query.get("connection").map_or("", String::as_str);
    let page = format!(
        "<!doctype html><meta charset=\"utf-8\"><title>Account connected</title>\
         <h1>Account connected</h1><p id=\"oauth-connected\">Your account is connected to \
         <b>{}</b>. Calls you make now act as you; you can close this page and call the tool \
         again.</p>",
        html_escaped(connection)
    );
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page,
    )
        .into_response()
}

/// A page naming the failed step (nothing was stored).
fn failure_page(err: &RegistryError) -> Response {
    let page = format!(
        "<!doctype html><meta charset=\"utf-8\"><title>OAuth connection failed</title>\
         <h1>OAuth connection failed</h1><p id=\"oauth-error\">{}</p>",
        html_escaped(&err.to_string())
    );
    (
        err.code().http(),
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page,
    )
        .into_response()
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
