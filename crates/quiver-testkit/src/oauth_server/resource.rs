//! The protected resource: the bearer check in front of `/mcp` (401 with a
//! challenge, 403 `insufficient_scope` for the admin tool) and the MCP
//! server behind it.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::options::{ADMIN_SCOPE, ADMIN_TOOL, SCOPE};
use super::state::{OAuthCaller, Shared};
use super::wire::MAX_BODY_BYTES;

/// The bearer check in front of `/mcp`.
pub(super) async fn require_bearer(
    State(shared): State<Arc<Shared>>,
    mut request: Request,
    next: Next,
) -> Response {
    let presented = request.headers().get(header::AUTHORIZATION).map(|value| {
        value
            .to_str()
            .ok()
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim().to_owned())
    });
    let caller = {
        let mut store = shared.store();
        let now = Instant::now();
        let caller = presented
            .as_ref()
            .and_then(Option::as_deref)
            .and_then(|token| store.access.get(token))
            .filter(|token| token.expires > now)
            .map(|token| (token.caller.clone(), token.scope.clone()));
        if caller.is_some() {
            store.stats.authorized_mcp_requests += 1;
        } else {
            store.stats.rejected_mcp_requests += 1;
        }
        caller
    };
    let Some((caller, scope)) = caller else {
        let given = presented.is_some();
        let challenge = shared.challenge(given);
        let description = if given {
            "the access token is unknown or expired"
        } else {
            "an access token is required"
        };
        return challenged(
            StatusCode::UNAUTHORIZED,
            if given {
                "invalid_token"
            } else {
                "unauthorized"
            },
            description.to_owned(),
            &challenge,
        );
    };
    let has_admin_scope = scope.split(' ').any(|granted| granted == ADMIN_SCOPE);
    if !has_admin_scope {
        // Step-up: `admin_echo` needs more than the token grants. The body
        // is read (bounded) to see which tool is called, then passed on.
        let (parts, body) = request.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
            return StatusCode::PAYLOAD_TOO_LARGE.into_response();
        };
        if calls_admin_tool(&bytes) {
            let challenge = format!(
                "Bearer error=\"insufficient_scope\", scope=\"{SCOPE} {ADMIN_SCOPE}\", resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
                shared.issuer
            );
            return challenged(
                StatusCode::FORBIDDEN,
                "insufficient_scope",
                format!("{ADMIN_TOOL} needs scope {ADMIN_SCOPE}"),
                &challenge,
            );
        }
        request = Request::from_parts(parts, axum::body::Body::from(bytes));
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// A refusal of `/mcp` with its `WWW-Authenticate` challenge.
pub(super) fn challenged(
    status: StatusCode,
    error: &str,
    description: String,
    challenge: &str,
) -> Response {
    let mut response = (
        status,
        axum::Json(json!({"error": error, "error_description": description})),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// Whether a JSON-RPC body calls [`ADMIN_TOOL`].
pub(super) fn calls_admin_tool(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|message| {
        message["method"] == "tools/call" && message["params"]["name"] == ADMIN_TOOL
    })
}

/// The protected MCP server: who am I (client and user), and echo.
#[derive(Clone)]
pub(super) struct OAuthMcpServer {
    pub(super) tool_router: rmcp::handler::server::router::tool::ToolRouter<Self>,
}

/// Arguments of `echo`.
#[derive(Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub(super) struct EchoParams {
    /// The text to return.
    pub(super) text: String,
}

#[tool_router]
impl OAuthMcpServer {
    pub(super) fn new() -> Self {
        Self {
            tool_router: Self::tool_router(),
        }
    }

    #[tool(description = "Returns the OAuth client id the request's access token was issued to.")]
    async fn whoami(&self, Extension(parts): Extension<Parts>) -> CallToolResult {
        caller_says(&parts, |caller| caller.client_id.clone())
    }

    #[tool(description = "Returns the user the request's access token was granted for.")]
    async fn whoami_user(&self, Extension(parts): Extension<Parts>) -> CallToolResult {
        caller_says(&parts, |caller| caller.user.to_string())
    }

    #[tool(description = "Returns `text` unchanged.")]
    async fn echo(&self, Parameters(EchoParams { text }): Parameters<EchoParams>) -> String {
        text
    }

    #[tool(description = "Returns `text` unchanged; needs scope mcp:admin.")]
    async fn admin_echo(&self, Parameters(EchoParams { text }): Parameters<EchoParams>) -> String {
        text
    }
}

/// `what` of the request's [`OAuthCaller`], as a tool result.
pub(super) fn caller_says(parts: &Parts, what: impl Fn(&OAuthCaller) -> String) -> CallToolResult {
    match parts.extensions.get::<OAuthCaller>() {
        Some(caller) => CallToolResult::success(vec![ContentBlock::text(what(caller))]),
        None => CallToolResult::error(vec![ContentBlock::text(
            "the request carries no authorized client",
        )]),
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for OAuthMcpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("quiver-testkit-oauth", env!("CARGO_PKG_VERSION")),
        )
    }
}
