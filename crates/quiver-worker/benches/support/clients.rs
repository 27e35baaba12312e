//! The MCP clients of the benchmarks that measure what a hop adds (issue
//! #23): [`RawMcp`], a JSON-RPC client of streamable HTTP with no MCP
//! library (what "a raw keep-alive client" costs, the baseline), and
//! [`rmcp_client`], the client library the worker's pool is built on.
//! Included with `#[path = "support/clients.rs"] mod clients;`.

use std::time::Duration;

use reqwest::header::{ACCEPT, HeaderName, HeaderValue};
use rmcp::RoleClient;
use rmcp::model::{JsonObject, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::stack::BenchResult;

/// Bound on each request of a raw client, the tool API's included, and on
/// an rmcp client's handshake. A timer costs a little per request
/// (reqwest's `timeout`) and a route's added time is taken over another
/// client's call, so the clients compared with each other are bounded alike.
const WAIT: Duration = Duration::from_secs(30);

/// The transport's headers, by name: reqwest takes a name given as text
/// apart on every request, and a client that sends the same headers on
/// every call names them once.
const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
const ACCEPTED: HeaderValue = HeaderValue::from_static("application/json, text/event-stream");
const TOOLS_CALL: &str = "tools/call";

/// A `tools/call` as every raw client sends it, serialised from its parts
/// rather than built as a JSON tree first, so that no client pays for a
/// tree the others do not build.
#[derive(Serialize)]
struct CallRequest<'a> {
    jsonrpc: &'static str,
    id: u64,
    method: &'static str,
    params: CallParams<'a>,
}

/// A call's parameters: a tool's, or (`name`, `arguments`) alone, the tool
/// API's request.
#[derive(Serialize)]
struct CallParams<'a> {
    name: &'a str,
    arguments: &'a JsonObject,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<&'a RawValue>,
}

/// The protocol era a client speaks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Era {
    /// 2025-11-25: `initialize`, a session.
    Session,
    /// 2026-07-28: no session, every request standing alone.
    Stateless,
}

impl Era {
    /// The protocol version it sends.
    pub fn version(self) -> &'static str {
        match self {
            Era::Session => "2025-11-25",
            Era::Stateless => "2026-07-28",
        }
    }
}

/// An rmcp client of `url` in the lifecycle of `era`, presenting `bearer`
/// if given; one request in flight at a time.
pub async fn rmcp_client(
    url: &str,
    era: Era,
    bearer: Option<&str>,
) -> BenchResult<RunningService<RoleClient, ()>> {
    let mut config =
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).max_concurrent_requests(1);
    if let Some(token) = bearer {
        config = config.auth_header(token.to_owned());
    }
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    let lifecycle = match era {
        Era::Session => ClientLifecycleMode::Initialize,
        Era::Stateless => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    };
    Ok(tokio::time::timeout(WAIT, ().serve_with_lifecycle(transport, lifecycle)).await??)
}

/// One raw client: one keep-alive connection, one request at a time.
pub struct RawMcp {
    http: reqwest::Client,
    url: String,
    bearer: Option<&'static str>,
    era: Era,
    session: Option<String>,
    /// A 2026-07-28 request's `_meta`, the same on every call: serialised
    /// once.
    meta: Option<Box<RawValue>>,
    next_id: u64,
}

impl RawMcp {
    /// A client of `url` in `era` (a session opened with `initialize`),
    /// presenting `bearer` if given.
    pub async fn connect(url: &str, era: Era, bearer: Option<&'static str>) -> BenchResult<Self> {
        let mut raw = RawMcp {
            http: reqwest::Client::new(),
            url: url.to_owned(),
            bearer,
            era,
            session: None,
            meta: match era {
                Era::Session => None,
                Era::Stateless => Some(serde_json::value::to_raw_value(&json!({
                    "io.modelcontextprotocol/protocolVersion": era.version(),
                    "io.modelcontextprotocol/clientInfo": {"name": "bench-raw", "version": "0"},
                    "io.modelcontextprotocol/clientCapabilities": {},
                }))?),
            },
            next_id: 0,
        };
        if era == Era::Session {
            let response = raw
                .post(&json!({
                    "jsonrpc": "2.0", "id": 0, "method": "initialize",
                    "params": {
                        "protocolVersion": era.version(),
                        "capabilities": {},
                        "clientInfo": {"name": "bench-raw", "version": "0"},
                    },
                }))
                .send()
                .await?
                .error_for_status()?;
            raw.session = Some(
                response
                    .headers()
                    .get(MCP_SESSION_ID)
                    .ok_or("no mcp-session-id in the initialize answer")?
                    .to_str()?
                    .to_owned(),
            );
            read_answer(response, 0).await?;
            raw.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
                .send()
                .await?
                .error_for_status()?;
        }
        Ok(raw)
    }

    fn post(&self, body: &impl Serialize) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(&self.url)
            .header(ACCEPT, ACCEPTED)
            .json(body)
            .timeout(WAIT);
        if let Some(token) = self.bearer {
            request = request.bearer_auth(token);
        }
        if let Some(session) = &self.session {
            request = request
                .header(MCP_SESSION_ID, session)
                .header(MCP_PROTOCOL_VERSION, self.era.version());
        }
        request
    }

    /// One `tools/call`: a session's, or a 2026-07-28 request with its
    /// `_meta` and the transport's headers; its result.
    pub async fn call(&mut self, tool: &str, arguments: JsonObject) -> BenchResult<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let body = CallRequest {
            jsonrpc: "2.0",
            id,
            method: TOOLS_CALL,
            params: CallParams {
                name: tool,
                arguments: &arguments,
                meta: self.meta.as_deref(),
            },
        };
        let mut request = self.post(&body);
        if self.era == Era::Stateless {
            request = request
                .header(MCP_PROTOCOL_VERSION, self.era.version())
                .header(MCP_METHOD, TOOLS_CALL)
                .header(MCP_NAME, tool);
        }
        let response = request.send().await?.error_for_status()?;
        read_answer(response, id).await
    }
}

/// One call through the worker's JSON tool API (`POST /v1/mcp/tools/call`
/// at `url`) of tool `name` (its injected name) as the bench caller; its
/// answer.
pub async fn tool_api_call(
    http: &reqwest::Client,
    url: &str,
    name: &str,
    arguments: JsonObject,
) -> BenchResult<Value> {
    Ok(http
        .post(url)
        .bearer_auth(crate::stack::CALLER_TOKEN)
        .json(&CallParams {
            name,
            arguments: &arguments,
            meta: None,
        })
        // Bounded as the MCP clients' requests are, so the tool API's
        // added time is not taken net of a timer only the baseline's set.
        .timeout(WAIT)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// The result of JSON-RPC request `id` in an answer, JSON or SSE (read to
/// its end).
async fn read_answer(response: reqwest::Response, id: u64) -> BenchResult<Value> {
    let is_sse = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let body = response.bytes().await?;
    let mut message: Value = if is_sse {
        std::str::from_utf8(&body)?
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim_start()).ok())
            .find(|message| message["id"] == id)
            .ok_or("no answer in the event stream")?
    } else {
        serde_json::from_slice(&body)?
    };
    match message.get_mut("result").map(Value::take) {
        Some(result) => Ok(result),
        None => Err(format!("not a result: {message}").into()),
    }
}
