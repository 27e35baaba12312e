//! The MCP endpoints (docs/reference.md §13.4): `/mcp` and `/mcp/{server_id}`,
//! streamable HTTP (POST, GET, DELETE), served by [`crate::gateway`].
//!
//! In order: `Host`/`Origin` (DNS-rebinding protection, 403), the caller's
//! bearer token as on the tool API (401 with the `WWW-Authenticate` header
//! the MCP authorization spec asks for, pointing at the protected-resource
//! metadata), then the gateway.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use quiver_mcp::ErrorCode;
use serde_json::json;

use crate::error::ErrorObject;
use crate::gateway::scope::Scope;
use crate::gateway::server::GatewayRequest;
use crate::http::error::ApiError;
use crate::http::extract::{self, RequestId};
use crate::http::state::ApiState;

/// Path of the protected-resource metadata (RFC 9728) of the MCP endpoints.
pub const RESOURCE_METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// `/mcp`.
pub async fn catalog(State(state): State<ApiState>, request: Request) -> Response {
    let scope = Scope::catalog(request.uri().query());
    serve(state, scope, request).await
}

/// `/mcp/{server_id}`.
pub async fn server(
    State(state): State<ApiState>,
    Path(server_id): Path<String>,
    request: Request,
) -> Response {
    serve(state, Scope::Server(server_id), request).await
}

/// `GET /.well-known/oauth-protected-resource`: what a client that got 401
/// needs to know. Callers present tokens the operator issued; no
/// authorization server hands them out, so none is listed.
pub async fn resource_metadata(request: Request) -> Response {
    let resource = format!("{}/mcp", origin_of(&request));
    axum::Json(json!({
        "resource": resource,
        "bearer_methods_supported": ["header"],
        "authorization_servers": [],
        "resource_name": "Quiver MCP gateway",
    }))
    .into_response()
}

/// `scheme://host` of the request, as the client addressed it.
fn origin_of(request: &Request) -> String {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let scheme = request.uri().scheme_str().unwrap_or("http");
    format!("{scheme}://{host}")
}

async fn serve(state: ApiState, scope: Scope, request: Request) -> Response {
    if let Err(refused) = state.rebinding.check(request.headers()) {
        tracing::warn!(error = %refused, "mcp request refused");
        return ApiError::from(ErrorObject::new(
            ErrorCode::ForbiddenOrigin,
            refused.to_string(),
        ))
        .into_response();
    }
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let caller = match state.callers.identify(authorization).await {
        Ok(caller) => caller,
        Err(refusal) => {
            let mut response = extract::refused(&refusal).into_response();
            if refusal.code() == ErrorCode::Unauthenticated {
                let challenge = format!(
                    "Bearer resource_metadata=\"{}{RESOURCE_METADATA_PATH}\"",
                    origin_of(&request)
                );
                if let Ok(challenge) = HeaderValue::from_str(&challenge) {
                    response
                        .headers_mut()
                        .insert(header::WWW_AUTHENTICATE, challenge);
                }
            }
            return response;
        }
    };
    let gateway_request = GatewayRequest {
        task: caller.task,
        caller: caller.id,
        scope,
        request_id: RequestId::of(request.headers()),
        session_id: None,
    };
    let (parts, body) = request.into_parts();
    state
        .gateway
        .handle(gateway_request, Request::from_parts(parts, Body::new(body)))
        .await
}
