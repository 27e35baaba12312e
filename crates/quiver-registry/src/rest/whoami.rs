//! `GET /whoami`: the role, principal and kind of credential of the caller,
//! whatever its role (the web admin signs in with it).

use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::rest::extract::AnyRole;

pub(super) async fn whoami(AnyRole(caller): AnyRole) -> Response {
    axum::Json(json!({
        "role": caller.role.as_str(),
        "principal": caller.principal,
        "via": caller.via,
    }))
    .into_response()
}
