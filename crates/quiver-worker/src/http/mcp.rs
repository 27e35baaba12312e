//! The MCP endpoints (docs/reference.md §13.4): `/mcp` and `/mcp/{server_id}`,
//! streamable HTTP (POST, GET, DELETE): the whole HTTP edge, before the
//! gateway (`crate::gateway`) serves what passed it.
//!
//! In order: `Host`/`Origin` (DNS-rebinding protection, 403), the caller's
//! bearer token as on the tool API (401 with the `WWW-Authenticate` header
//! the MCP authorization spec asks for, pointing at the protected-resource
//! metadata), a POST body read within its limit and judged as one JSON-RPC
//! message (the transport spec's -32700/-32600, nesting bounded before any
//! parser recurses), an `initialize` or `server/discover` at an endpoint
//! that would serve the caller nothing refused (404); then the gateway —
//! a plain stateless `tools/call` directly (`plain`), anything else
//! through rmcp's streamable-HTTP service. Every answer is counted in
//! `mcp_gateway_requests_total`.

mod plain;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use quiver_model::ErrorCode;
use quiver_model::policy::server_selected;
use rmcp::model::ClientJsonRpcMessage;
use serde::Deserialize;
use serde_json::json;

use crate::error::ErrorObject;
use crate::gateway::scope::Scope;
use crate::gateway::server::GatewayRequest;
use crate::gateway::{Posted, jsonrpc_error};
use crate::http::error::ApiError;
use crate::http::extract::{self, RequestId};
use crate::http::state::ApiState;

/// JSON nested deeper than this is refused at the edge (-32700), before
/// any parser recurses into it.
pub const MAX_JSON_DEPTH: usize = 64;

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
    let http_method = request.method().clone();
    let (rpc_method, response) = admit(state, scope, request).await;
    count(&http_method, &rpc_method, response)
}

/// The edge's checks, then the gateway; the JSON-RPC method (empty when
/// none was read) and the answer.
async fn admit(state: ApiState, scope: Scope, request: Request) -> (String, Response) {
    if let Err(refused) = state.rebinding.check(request.headers()) {
        tracing::warn!(error = %refused, "mcp request refused");
        let error = ErrorObject::new(ErrorCode::ForbiddenOrigin, refused.to_string());
        return (String::new(), ApiError::from(error).into_response());
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
            return (String::new(), response);
        }
    };
    let gateway_request = GatewayRequest {
        task: caller.task,
        caller: caller.id,
        scope,
        request_id: RequestId::of(request.headers()),
        session: None,
    };
    let (parts, body) = request.into_parts();
    // POST bodies are read here (bounded) for the method and, for
    // `initialize`, the protocol version the session id will carry.
    let (body, posted) = if parts.method == axum::http::Method::POST {
        let limit = state.gateway.max_request_bytes();
        let bytes = match axum::body::to_bytes(Body::new(body), limit).await {
            Ok(bytes) => bytes,
            Err(_) => {
                let error = ErrorObject::new(
                    ErrorCode::PayloadTooLarge,
                    format!("request body over {limit} bytes"),
                );
                return (String::new(), ApiError::from(error).into_response());
            }
        };
        if let Err(refused) = shallow(&bytes) {
            return (String::new(), refused);
        }
        // A plain call is read once, straight into its parts: what it is
        // read as is a valid JSON-RPC request, so the envelope's checks
        // would all pass.
        if let Some(call) = plain::plain_call(&parts.headers, &bytes) {
            let response = plain::answer(&state.gateway, gateway_request, call).await;
            return (plain::METHOD.to_owned(), response);
        }
        let posted = match jsonrpc_envelope(&bytes) {
            Ok(posted) => posted,
            Err(refused) => return (String::new(), refused),
        };
        if let Err(refused) = readable(&bytes) {
            return (posted.method, refused);
        }
        (Body::from(bytes), Some(posted))
    } else {
        (Body::new(body), None)
    };
    let rpc_method = posted
        .as_ref()
        .map(|posted| posted.method.clone())
        .unwrap_or_default();
    if matches!(rpc_method.as_str(), "initialize" | "server/discover")
        && let Err(refused) = check_scope(&state, &gateway_request)
    {
        return (rpc_method, refused);
    }
    // Boxed: rmcp's service is much larger than a plain call's path, and
    // inline it would make every request's future (moved whole on its way
    // to hyper) as large as its own.
    let response = Box::pin(state.gateway.handle(
        gateway_request,
        posted,
        Request::from_parts(parts, body),
    ))
    .await
    .unwrap_or_else(|refused| ApiError::from(refused).into_response());
    (rpc_method, response)
}

/// Refuses an `initialize` (or `server/discover`) at an endpoint that
/// would serve the caller nothing: `/mcp/{id}` or `/mcp?server_ids=…`
/// naming only servers that are absent or that the caller's task does not
/// select (404, naming them); no session is created.
#[expect(clippy::result_large_err, reason = "the error is the response itself")]
fn check_scope(state: &ApiState, request: &GatewayRequest) -> Result<(), Response> {
    let named: Vec<&String> = match &request.scope {
        Scope::Server(id) => vec![id],
        Scope::Catalog {
            server_ids: Some(ids),
        } => ids.iter().collect(),
        Scope::Catalog { server_ids: None } => return Ok(()),
    };
    let snapshot = state.snapshot.current();
    let available = |id: &String| {
        snapshot
            .get(id)
            .is_some_and(|server| server_selected(&server.spec, &request.task.policy, None).is_ok())
    };
    if named.iter().any(|id| available(id)) {
        return Ok(());
    }
    let error = ErrorObject::new(
        ErrorCode::NotFound,
        format!(
            "no server available to this caller at this endpoint: {}",
            named
                .iter()
                .map(|id| format!("{id:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    Err(ApiError::from(error).into_response())
}

/// Counts a request in `mcp_gateway_requests_total`.
fn count(http_method: &axum::http::Method, rpc_method: &str, response: Response) -> Response {
    // Methods are the client's strings: only the protocol's names become
    // labels, so a client cannot grow the metric without bound.
    let method: &'static str = match rpc_method {
        "" => match *http_method {
            axum::http::Method::GET => "GET",
            axum::http::Method::POST => "POST",
            axum::http::Method::DELETE => "DELETE",
            _ => "other",
        },
        method => MCP_METHODS
            .iter()
            .find(|known| **known == method)
            .unwrap_or(&"other"),
    };
    metrics::counter!(
        "mcp_gateway_requests_total",
        "method" => method,
        "status" => response.status().as_u16().to_string()
    )
    .increment(1);
    response
}

/// The protocol's method names (labels of `mcp_gateway_requests_total`).
const MCP_METHODS: &[&str] = &[
    "initialize",
    "server/discover",
    "subscriptions/listen",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
];

/// The part of a JSON-RPC message the edge looks at, read in one pass
/// without building the message (rmcp parses it after).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a str>,
    #[serde(borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    result: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    error: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    params: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    id: Option<&'a serde_json::value::RawValue>,
}

/// How deep `body` nests arrays and objects (outside strings), counting
/// no further than `limit + 1`. Strings, most of a request's bytes, are
/// skipped with `memchr` to their closing quote rather than walked byte by
/// byte; an unterminated one ends the scan (the parser refuses it).
fn json_depth(body: &[u8], limit: usize) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut rest = body;
    while let Some(at) = rest
        .iter()
        .position(|byte| matches!(byte, b'"' | b'[' | b'{' | b']' | b'}'))
    {
        let byte = rest[at];
        rest = &rest[at + 1..];
        match byte {
            b'"' => loop {
                match memchr::memchr2(b'"', b'\\', rest) {
                    Some(quote) if rest[quote] == b'"' => {
                        rest = &rest[quote + 1..];
                        break;
                    }
                    // An escape: the next byte is taken with it.
                    Some(backslash) => rest = rest.get(backslash + 2..).unwrap_or_default(),
                    None => return deepest,
                }
            },
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
                if deepest > limit {
                    return deepest;
                }
            }
            _ => depth = depth.saturating_sub(1),
        }
    }
    deepest
}

/// Whether a JSON-RPC id is one MCP allows: a string or an integer.
fn valid_id(id: &serde_json::value::RawValue) -> bool {
    let text = id.get();
    (text.starts_with('"') && serde_json::from_str::<String>(text).is_ok())
        || serde_json::from_str::<i64>(text).is_ok()
}

#[derive(Deserialize)]
struct InitializeParams {
    #[serde(rename = "protocolVersion")]
    protocol_version: Option<String>,
}

/// A POST body nested no deeper than [`MAX_JSON_DEPTH`], judged before any
/// parser (ours or rmcp's) recurses into it; -32700 otherwise.
#[expect(clippy::result_large_err, reason = "the error is the response itself")]
fn shallow(body: &[u8]) -> Result<(), Response> {
    if json_depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH {
        return Err(jsonrpc_error(
            StatusCode::BAD_REQUEST,
            -32700,
            &format!("Parse error: JSON nested deeper than {MAX_JSON_DEPTH} levels"),
        ));
    }
    Ok(())
}

/// What a POST body (already [`shallow`]) says, or the JSON-RPC error the
/// transport spec prescribes for it: -32700 for a body that is not JSON,
/// -32600 for JSON that is not one JSON-RPC 2.0 message (batches were
/// removed in 2025-06-18).
#[expect(clippy::result_large_err, reason = "the error is the response itself")]
fn jsonrpc_envelope(body: &[u8]) -> Result<Posted, Response> {
    let invalid = |detail: &str| {
        jsonrpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            &format!("Invalid Request: {detail}"),
        )
    };
    let parse_error = |detail: &str| {
        jsonrpc_error(
            StatusCode::BAD_REQUEST,
            -32700,
            &format!("Parse error: {detail}"),
        )
    };
    let envelope: Envelope<'_> = match serde_json::from_slice(body) {
        Ok(envelope) => envelope,
        // Valid JSON of another shape (an array, a number, fields of the
        // wrong type) is an invalid request; anything else a parse error.
        Err(err) if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() => {
            return Err(invalid(&err.to_string()));
        }
        Err(err) => return Err(parse_error(&err.to_string())),
    };
    if envelope.jsonrpc != Some("2.0")
        || (envelope.method.is_none() && envelope.result.is_none() && envelope.error.is_none())
    {
        return Err(invalid("the body must be one JSON-RPC 2.0 message"));
    }
    // A request or a result names its id: a string or an integer (MCP: not
    // null); an error may carry a null id (JSON-RPC 2.0 §5).
    let null_allowed = envelope.error.is_some() && envelope.method.is_none();
    match envelope.id {
        Some(id) if id.get() == "null" && null_allowed => {}
        Some(id) if !valid_id(id) => {
            return Err(invalid("id must be a string or an integer"));
        }
        None if envelope.method.is_none() => {
            return Err(invalid("a response must carry the id of its request"));
        }
        _ => {}
    }
    let method = envelope.method.map(|m| m.into_owned()).unwrap_or_default();
    let protocol_version = (method == "initialize")
        .then_some(envelope.params)
        .flatten()
        .and_then(|params| serde_json::from_str::<InitializeParams>(params.get()).ok())
        .and_then(|params| params.protocol_version);
    Ok(Posted {
        method,
        protocol_version,
    })
}

/// Refuses (-32600) a well-formed JSON-RPC message that rmcp's transport
/// cannot read as a client message, with the JSON-RPC error rather than the
/// transport's unsupported media type. The lean edge's plain calls, read by
/// a parser of their own, never come here.
#[expect(clippy::result_large_err, reason = "the error is the response itself")]
fn readable(body: &[u8]) -> Result<(), Response> {
    match serde_json::from_slice::<ClientJsonRpcMessage>(body) {
        Ok(_) => Ok(()),
        Err(err) => Err(jsonrpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            &format!("Invalid Request: {err}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The edge's judgement of a body that is not a plain call.
    #[expect(clippy::result_large_err, reason = "the error is the response itself")]
    fn judged(body: &[u8]) -> Result<Posted, Response> {
        shallow(body)?;
        let posted = jsonrpc_envelope(body)?;
        readable(body)?;
        Ok(posted)
    }

    fn code_of(body: &str) -> Option<u16> {
        judged(body.as_bytes())
            .err()
            .map(|response| response.status().as_u16())
    }

    #[test]
    fn post_bodies_are_judged_in_one_pass() {
        let posted = judged(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{}}}"#,
        )
        .unwrap_or_else(|_| panic!("initialize refused"));
        assert_eq!(posted.method, "initialize");
        assert_eq!(posted.protocol_version.as_deref(), Some("2025-06-18"));
        let call = judged(
            br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","arguments":{"protocolVersion":1}}}"#,
        )
        .unwrap_or_else(|_| panic!("tools/call refused"));
        assert_eq!(
            (call.method.as_str(), call.protocol_version),
            ("tools/call", None)
        );
        assert!(judged(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#).is_ok());
        for bad in ["{not json", "", "[1"] {
            assert_eq!(code_of(bad), Some(400), "{bad}");
        }
        for invalid in [
            "[]",
            "42",
            r#"{"id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
            r#"{"jsonrpc":"2.0","method":7}"#,
        ] {
            assert_eq!(code_of(invalid), Some(400), "{invalid}");
        }
    }

    fn rpc_code_of(body: &str) -> (u16, i64) {
        let response = judged(body.as_bytes())
            .err()
            .unwrap_or_else(|| panic!("{body} accepted"));
        let status = response.status().as_u16();
        let bytes =
            futures::executor::block_on(axum::body::to_bytes(response.into_body(), 1 << 16))
                .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON error");
        (status, body["error"]["code"].as_i64().unwrap_or_default())
    }

    #[test]
    fn bad_ids_and_deep_nesting_are_refused_with_their_jsonrpc_codes() {
        for bad_id in [
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":[1],"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":true,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":7}"#,
        ] {
            assert_eq!(rpc_code_of(bad_id), (400, -32600), "{bad_id}");
        }
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}1{}}}}}}}"#,
            "[".repeat(5_000),
            "]".repeat(5_000)
        );
        assert_eq!(rpc_code_of(&deep), (400, -32700));
        // Brackets inside strings do not count.
        let quoted = format!(
            r#"{{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{{"name":"x","arguments":{{"s":"{}\"{}"}}}}}}"#,
            "[".repeat(5_000),
            "{".repeat(10)
        );
        assert!(judged(quoted.as_bytes()).is_ok());
        for fine in [
            r#"{"jsonrpc":"2.0","id":"x","method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":-3,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        ] {
            assert!(judged(fine.as_bytes()).is_ok(), "{fine}");
        }
    }

    #[test]
    fn depth_counts_brackets_outside_strings_only() {
        for (body, depth) in [
            (r#"{}"#, 1),
            (r#"{"a":[1,{"b":[]}]}"#, 4),
            (r#"{"a":"[[[{{{"}"#, 1),
            (r#"{"a":"\"[[","b":[[]]}"#, 3),
            (r#"{"a":"\\","b":[[]]}"#, 3),
            (r#"{"a":"\\\"{{{\\","b":[]}"#, 2),
            (r#"[[["unterminated [[[["#, 3),
            (r#"{"a":"ends in an escape\"#, 1),
            (r#"{"é":"ü","b":[{}]}"#, 3),
        ] {
            assert_eq!(json_depth(body.as_bytes(), 64), depth, "{body}");
        }
        let deep = "[".repeat(100);
        assert_eq!(json_depth(deep.as_bytes(), 64), 65, "counted no further");
    }

    /// How deep a JSON value nests, as [`json_depth`] counts it.
    fn nesting(value: &serde_json::Value) -> usize {
        match value {
            serde_json::Value::Array(items) => 1 + items.iter().map(nesting).max().unwrap_or(0),
            serde_json::Value::Object(map) => 1 + map.values().map(nesting).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// Strings full of what the scan must see past.
    const TRICKY: &[&str] = &["\\", "\"", "[{", "}]", "\\\"[", "é\\", "\\\\["];

    proptest::proptest! {
        #![proptest_config(quiver_testkit::fuzz::cases(256))]
        /// The scan agrees with the parser on any document, strings with
        /// quotes, escapes and brackets included.
        #[test]
        fn depth_is_the_documents_nesting(value in quiver_testkit::fuzz::json_value(
            &["a", "[", "\"{"], quiver_testkit::fuzz::words(TRICKY), 6,
        )) {
            let text = serde_json::to_vec(&value).expect("serialized");
            proptest::prop_assert_eq!(json_depth(&text, 64), nesting(&value));
        }
    }
}
