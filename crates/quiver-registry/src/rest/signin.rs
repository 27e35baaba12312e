//! The web admin's sign-in pages (docs/reference.md §12.2), at the root of
//! the HTTP listener: the providers it offers, the start of the
//! authorization-code flow, the identity provider's way back, and sign-out.
//! The flow and the sealed cookies are [`crate::signin`]'s.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use quiver_model::access::{AccessKind, AccessSpec};
use serde_json::{Value, json};

use crate::error::RegistryError;
use crate::signin::{
    CallbackParams, FLOW_COOKIE, SESSION_TTL, WEB_ADMIN, cookie_value, session_person,
};
use crate::state::RegistryState;

/// Routes of sign-in, at the root of the HTTP listener.
pub fn signin_pages() -> Router<RegistryState> {
    Router::new()
        .route("/admin/signin/providers", get(providers))
        .route("/admin/signin/callback", get(callback))
        .route("/admin/signin/{provider}", get(start))
        .route("/admin/signout", post(signout))
}

async fn providers(State(state): State<RegistryState>) -> Result<Response, RegistryError> {
    let head = state.feed.head().await?;
    let names: Vec<Value> = head
        .access_of(AccessKind::IdentityProvider)
        .filter_map(|record| match &record.spec {
            AccessSpec::IdentityProvider(p) if p.web_client_id.is_some() => {
                Some(json!({"name": p.name}))
            }
            _ => None,
        })
        .collect();
    Ok(axum::Json(json!({"providers": names})).into_response())
}

async fn start(State(state): State<RegistryState>, Path(provider): Path<String>) -> Response {
    let result = async {
        let head = state.feed.head().await?;
        state.signin.start(&head, &provider).await
    }
    .await;
    match result {
        Ok((location, cookie)) => (
            StatusCode::SEE_OTHER,
            [(header::LOCATION, location), (header::SET_COOKIE, cookie)],
        )
            .into_response(),
        Err(err) => back_with_error(&err.to_string()),
    }
}

async fn callback(
    State(state): State<RegistryState>,
    headers: HeaderMap,
    Query(params): Query<CallbackParams>,
) -> Response {
    let head = match state.feed.head().await {
        Ok(head) => head,
        Err(err) => return back_with_error(&err.to_string()),
    };
    let cleared = format!("{FLOW_COOKIE}=; Path=/admin/signin; Max-Age=0; HttpOnly; SameSite=Lax");
    match state
        .signin
        .finish(&head, cookie_value(&headers, FLOW_COOKIE), &params)
        .await
    {
        Ok(session) => {
            let cookie = state.signin.session_cookie(&session, SESSION_TTL.as_secs());
            let mut response =
                (StatusCode::SEE_OTHER, [(header::LOCATION, WEB_ADMIN)]).into_response();
            for value in [cookie, cleared] {
                if let Ok(value) = value.parse() {
                    response.headers_mut().append(header::SET_COOKIE, value);
                }
            }
            response
        }
        Err(why) => {
            tracing::warn!(target: "quiver::audit", action = "signin_refused", reason = %why, "sign-in refused");
            back_with_error(&why)
        }
    }
}

async fn signout(
    State(state): State<RegistryState>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    if let Some(Err(err)) = session_person(&state.signin, &method, &headers) {
        return err.into_response();
    }
    (
        StatusCode::NO_CONTENT,
        [(header::SET_COOKIE, state.signin.session_cookie("", 0))],
    )
        .into_response()
}

/// Back to the web admin, which shows why sign-in failed.
fn back_with_error(why: &str) -> Response {
    let query: String = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("signin_error", why)
        .finish();
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, format!("{WEB_ADMIN}?{query}"))],
    )
        .into_response()
}
