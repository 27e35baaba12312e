//! The lean edge of the stateless path (MCP 2026-07-28, issue #23): a
//! *plain* `tools/call` is answered by the gateway directly
//! ([`crate::gateway::Gateway::call_plain`]) instead of through rmcp's
//! streamable-HTTP service, which builds a server, a service task and its
//! channels for every request without a session.
//!
//! Plain is the common case whose every transport check rmcp would pass:
//! a POST without a session, a JSON body accepted as JSON or SSE,
//! `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` each present once
//! and agreeing with the body (the name unencoded), no `Mcp-Param-*`
//! header, and `_meta` of 2026-07-28 with every required key. Anything else
//! goes to rmcp as before, so every refusal the specification asks for is
//! still rmcp's. A plain request is answered as rmcp answers it with
//! `json_response`: the same handler and result epilogue, as JSON with the
//! same HTTP status when the result is all there is to say, as an SSE
//! stream when progress or a log message comes first.

use std::convert::Infallible;
use std::pin::Pin;

use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use rmcp::model::{
    CallToolRequestParams, ErrorCode as RpcCode, InputResponses, JsonObject, JsonRpcMessage,
    JsonRpcVersion2_0, ProtocolVersion, RequestId, ServerJsonRpcMessage, ServerNotification,
};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_MCP_PARAM_PREFIX, JSON_MIME_TYPE,
};
use serde::Deserialize;

use crate::gateway::Gateway;
use crate::gateway::peer::{RelayReceiver, RelaySender, relay_channel};
use crate::gateway::request_meta::{CurrentMeta, RequestMeta};
use crate::gateway::server::GatewayRequest;

/// A plain stateless `tools/call`, taken apart.
pub struct PlainCall {
    /// The JSON-RPC id.
    pub id: RequestId,
    /// The request's `_meta`.
    pub meta: RequestMeta,
    /// The call.
    pub params: CallToolRequestParams,
}

/// The one method the lean edge answers.
pub const METHOD: &str = "tools/call";

/// The transport's headers the edge looks up, by name: rmcp spells them in
/// mixed case, and a lookup by text lower-cases the name on every request.
const SESSION_ID: HeaderName = HeaderName::from_static(crate::gateway::SESSION_HEADER);
const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// A `tools/call` as the lean edge reads it: once, straight into its
/// parameters, neither the edge's envelope (`crate::http::mcp`) nor rmcp's
/// reading of a client message (an untagged enum over every message and
/// request type, whose failed attempts each build an error, which cost
/// more than the rest of the edge together). A body read this way is a
/// valid JSON-RPC request: version 2.0, an id that is a string or an
/// integer, no field twice.
#[derive(Deserialize)]
struct PlainRequest<'a> {
    #[serde(rename = "jsonrpc")]
    _jsonrpc: JsonRpcVersion2_0,
    #[serde(borrow)]
    method: std::borrow::Cow<'a, str>,
    id: RequestId,
    params: PlainParams,
}

/// A plain call's parameters: rmcp's `CallToolRequestParams`, with its
/// `_meta` read as the gateway uses it ([`CurrentMeta`]: only a complete
/// one of 2026-07-28 makes the call plain).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PlainParams {
    #[serde(rename = "_meta")]
    meta: CurrentMeta,
    name: String,
    arguments: Option<JsonObject>,
    input_responses: Option<InputResponses>,
    request_state: Option<String>,
}

/// The `tools/call` in `body` if the request is plain (see the module
/// docs); `None` sends it the general way.
pub fn plain_call(headers: &HeaderMap, body: &[u8]) -> Option<PlainCall> {
    let transport = Transport::read(headers)?;
    let plain = transport.accepts_json
        && transport.accepts_sse
        && transport.content_type.is_some_and(is_json)
        && transport.protocol_version == Some(ProtocolVersion::V_2026_07_28.as_str())
        && transport.method == Some(METHOD);
    if !plain {
        return None;
    }
    let tool = transport.name?;
    let PlainRequest {
        method, id, params, ..
    } = serde_json::from_slice(body).ok()?;
    if method != METHOD || tool != params.name {
        return None;
    }
    let mut call = CallToolRequestParams::new(params.name);
    call.arguments = params.arguments;
    call.input_responses = params.input_responses;
    call.request_state = params.request_state;
    Some(PlainCall {
        id,
        meta: params.meta.0,
        params: call,
    })
}

/// Runs `call` and answers it: as JSON when its result is all there is to
/// say, as an SSE stream when the server relayed something first.
pub async fn answer(gateway: &Gateway, request: GatewayRequest, call: PlainCall) -> Response {
    if call.meta.progress_token.is_none() && call.meta.log_level.is_none() {
        // Nothing is relayed about such a call: its result is its answer.
        let result: Answer = Box::pin(gateway.call_plain(
            request,
            call.id,
            call.meta,
            call.params,
            RelaySender::none(),
        ));
        return json(result.await);
    }
    let (relay, mut relayed) = relay_channel();
    let mut result: Answer =
        Box::pin(gateway.call_plain(request, call.id, call.meta, call.params, relay));
    let first = tokio::select! {
        message = &mut result => match relayed.try_next() {
            None => return json(message),
            Some(first) => (first, Feed::Draining(Box::new(message), relayed)),
        },
        Some(first) = relayed.next() => (first, Feed::Running(result, relayed)),
    };
    sse(gateway, first.0, first.1)
}

/// The call's future: its result as the message that ends the answer.
type Answer = Pin<Box<dyn Future<Output = ServerJsonRpcMessage> + Send>>;

/// What an SSE answer still has to send after its first notification.
enum Feed {
    /// The call runs: its notifications, then its result.
    Running(Answer, RelayReceiver),
    /// The call is done: what it relayed before, then its result.
    Draining(Box<ServerJsonRpcMessage>, RelayReceiver),
    Done,
}

impl Feed {
    /// The next message and what follows it.
    async fn next(self) -> Option<(ServerJsonRpcMessage, Feed)> {
        match self {
            Feed::Running(mut result, mut relayed) => tokio::select! {
                biased;
                Some(note) = relayed.next() => {
                    Some((ServerJsonRpcMessage::notification(note), Feed::Running(result, relayed)))
                }
                message = &mut result => Feed::Draining(Box::new(message), relayed).drain(),
            },
            Feed::Draining(message, relayed) => Feed::Draining(message, relayed).drain(),
            Feed::Done => None,
        }
    }

    /// What was relayed before the result, one at a time, then the result.
    fn drain(self) -> Option<(ServerJsonRpcMessage, Feed)> {
        let Feed::Draining(message, mut relayed) = self else {
            return None;
        };
        Some(match relayed.try_next() {
            Some(note) => (
                ServerJsonRpcMessage::notification(note),
                Feed::Draining(message, relayed),
            ),
            None => (*message, Feed::Done),
        })
    }
}

/// The answer as one JSON message, with the HTTP status rmcp's transport
/// gives it.
fn json(message: ServerJsonRpcMessage) -> Response {
    let status = match &message {
        JsonRpcMessage::Error(error) => error_status(error.error.code),
        _ => StatusCode::OK,
    };
    (status, axum::Json(message)).into_response()
}

/// The answer as an SSE stream: `first`, then what `feed` has.
fn sse(gateway: &Gateway, first: ServerNotification, feed: Feed) -> Response {
    let rest = futures::stream::unfold(feed, Feed::next);
    let events = futures::stream::once(std::future::ready(ServerJsonRpcMessage::notification(
        first,
    )))
    .chain(rest)
    .map(event);
    let sse = Sse::new(events);
    match gateway.sse_keep_alive() {
        Some(interval) => sse
            .keep_alive(KeepAlive::new().interval(interval))
            .into_response(),
        None => sse.into_response(),
    }
}

fn event(message: ServerJsonRpcMessage) -> Result<Event, Infallible> {
    Ok(Event::default().data(serde_json::to_string(&message).unwrap_or_default()))
}

/// The HTTP status of a JSON-RPC error answering a well-formed request
/// without a session, as rmcp's streamable-HTTP server maps it
/// (`jsonrpc_http_status`): the transport-level refusals are 400, an
/// unknown method 404, everything else travels in a 200.
fn error_status(code: RpcCode) -> StatusCode {
    match code {
        RpcCode::UNSUPPORTED_PROTOCOL_VERSION
        | RpcCode::MISSING_REQUIRED_CLIENT_CAPABILITY
        | RpcCode::HEADER_MISMATCH => StatusCode::BAD_REQUEST,
        RpcCode::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
        _ => StatusCode::OK,
    }
}

/// The transport's headers of a request, read in one pass: those that
/// must be sent once as text are `None` when absent.
#[derive(Default)]
struct Transport<'h> {
    /// `Accept` names JSON, without parameters.
    accepts_json: bool,
    /// `Accept` names SSE, without parameters.
    accepts_sse: bool,
    content_type: Option<&'h str>,
    protocol_version: Option<&'h str>,
    method: Option<&'h str>,
    name: Option<&'h str>,
}

impl<'h> Transport<'h> {
    /// `None` when the request is not plain by its headers alone: it has a
    /// session or a parameter header, one of the headers above is sent
    /// twice or not as text, or `Accept` weighs a media type (a weight
    /// could exclude one: rmcp judges those).
    fn read(headers: &'h HeaderMap) -> Option<Self> {
        let mut transport = Transport::default();
        for (name, value) in headers {
            let slot = if name == header::ACCEPT {
                transport.accept(value.to_str().ok()?)?;
                continue;
            } else if name == header::CONTENT_TYPE {
                &mut transport.content_type
            } else if name == PROTOCOL_VERSION {
                &mut transport.protocol_version
            } else if name == MCP_METHOD {
                &mut transport.method
            } else if name == MCP_NAME {
                &mut transport.name
            } else if name == SESSION_ID || is_param_header(name) {
                return None;
            } else {
                continue;
            };
            if slot.is_some() {
                return None;
            }
            *slot = Some(value.to_str().ok()?);
        }
        Some(transport)
    }

    /// Notes the media types one `Accept` value names.
    fn accept(&mut self, value: &str) -> Option<()> {
        for media in value.split(',').map(str::trim) {
            if media.contains(';') {
                return None;
            }
            self.accepts_json |= media.eq_ignore_ascii_case(JSON_MIME_TYPE);
            self.accepts_sse |= media.eq_ignore_ascii_case(EVENT_STREAM_MIME_TYPE);
        }
        Some(())
    }
}

/// A `Content-Type` of JSON.
fn is_json(value: &str) -> bool {
    let essence = value.split_once(';').map_or(value, |(essence, _)| essence);
    essence.trim().eq_ignore_ascii_case(JSON_MIME_TYPE)
}

fn is_param_header(name: &HeaderName) -> bool {
    name.as_str()
        .get(..HEADER_MCP_PARAM_PREFIX.len())
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case(HEADER_MCP_PARAM_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const BODY: &str = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}"#;

    fn headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("accept", "application/json, text/event-stream"),
            ("content-type", "application/json"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        headers
    }

    fn judged(headers: &HeaderMap, body: &str) -> Option<PlainCall> {
        plain_call(headers, body.as_bytes())
    }

    #[test]
    fn the_headers_are_the_ones_rmcp_names() {
        use rmcp::transport::common::http_header::{
            HEADER_MCP_METHOD, HEADER_MCP_NAME, HEADER_MCP_PROTOCOL_VERSION, HEADER_SESSION_ID,
        };
        for (ours, rmcp) in [
            (SESSION_ID, HEADER_SESSION_ID),
            (PROTOCOL_VERSION, HEADER_MCP_PROTOCOL_VERSION),
            (MCP_METHOD, HEADER_MCP_METHOD),
            (MCP_NAME, HEADER_MCP_NAME),
        ] {
            assert!(ours.as_str().eq_ignore_ascii_case(rmcp), "{ours} is {rmcp}");
        }
    }

    #[test]
    fn a_plain_call_is_taken_apart() {
        let plain = judged(&headers(), BODY).expect("plain");
        assert_eq!(plain.id, RequestId::Number(7));
        assert_eq!(plain.params.name, "echo");
        assert!(plain.meta.client_capabilities.is_some());
        assert!(plain.params.arguments.is_some());
        // Progress and log messages are relayed on an SSE answer.
        for opted_in in [
            r#""_meta":{"progressToken":1,"#,
            r#""_meta":{"io.modelcontextprotocol/logLevel":"info","#,
        ] {
            let body = BODY.replace(r#""_meta":{"#, opted_in);
            assert!(judged(&headers(), &body).is_some(), "{opted_in}");
        }
    }

    /// What a case changes of a plain request's headers.
    type HeaderChange = fn(&mut HeaderMap);

    #[test]
    fn anything_unusual_goes_the_general_way() {
        let cases: Vec<(&str, HeaderChange)> = vec![
            ("a session", |h| {
                h.insert("mcp-session-id", HeaderValue::from_static("s"));
            }),
            ("an older version", |h| {
                h.insert(
                    "mcp-protocol-version",
                    HeaderValue::from_static("2025-11-25"),
                );
            }),
            ("no Mcp-Method", |h| {
                h.remove("mcp-method");
            }),
            ("another Mcp-Method", |h| {
                h.insert("mcp-method", HeaderValue::from_static("tools/list"));
            }),
            ("a second Mcp-Method", |h| {
                h.append("mcp-method", HeaderValue::from_static("tools/call"));
            }),
            ("a second Mcp-Name", |h| {
                h.append("mcp-name", HeaderValue::from_static("echo"));
            }),
            ("no Mcp-Name", |h| {
                h.remove("mcp-name");
            }),
            ("another Mcp-Name", |h| {
                h.insert("mcp-name", HeaderValue::from_static("add"));
            }),
            ("an encoded Mcp-Name", |h| {
                h.insert("mcp-name", HeaderValue::from_static("=?base64?ZWNobw==?="));
            }),
            ("a parameter header", |h| {
                h.insert("mcp-param-text", HeaderValue::from_static("hi"));
            }),
            ("a weighted Accept", |h| {
                h.insert(
                    "accept",
                    HeaderValue::from_static("application/json;q=0, text/event-stream"),
                );
            }),
            ("JSON not accepted", |h| {
                h.insert("accept", HeaderValue::from_static("text/event-stream"));
            }),
            ("a text body", |h| {
                h.insert("content-type", HeaderValue::from_static("text/plain"));
            }),
        ];
        for (case, change) in cases {
            let mut headers = headers();
            change(&mut headers);
            assert!(judged(&headers, BODY).is_none(), "{case}");
        }
        for (case, body) in [
            (
                "no client capabilities",
                BODY.replace(r#","io.modelcontextprotocol/clientCapabilities":{}"#, ""),
            ),
            ("another method", BODY.replace("tools/call", "tools/list")),
            ("a notification", BODY.replace(r#""id":7,"#, "")),
            ("not JSON-RPC", "{".to_owned()),
            // What the edge's envelope refuses is not plain either.
            ("another version", BODY.replace(r#""2.0""#, r#""1.0""#)),
            ("no version", BODY.replace(r#""jsonrpc":"2.0","#, "")),
            ("a null id", BODY.replace(r#""id":7"#, r#""id":null"#)),
            ("a fractional id", BODY.replace(r#""id":7"#, r#""id":7.5"#)),
            (
                "a field twice",
                BODY.replace(r#""id":7"#, r#""id":7,"id":8"#),
            ),
        ] {
            assert!(judged(&headers(), &body).is_none(), "{case}");
        }
    }
}
