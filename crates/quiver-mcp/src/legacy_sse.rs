//! Client side of MCP's legacy "HTTP+SSE" transport (protocol 2024-11-05).
//!
//! rmcp dropped its own legacy SSE client, so this module supplies one as an rmcp
//! [`Transport`]: rmcp keeps doing all JSON-RPC (ids, routing, initialization) and the
//! transport only moves [`ClientJsonRpcMessage`]s out (HTTP POSTs to the endpoint the
//! server announced) and [`ServerJsonRpcMessage`]s in (`message` events of the SSE
//! stream, parsed by `sse-stream`, the parser rmcp itself uses).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use quiver_mcp::legacy_sse::LegacySseClientTransport;
//! use rmcp::ServiceExt;
//!
//! let transport = LegacySseClientTransport::connect(
//!     reqwest::Client::new(),
//!     "http://127.0.0.1:3001/sse".parse()?,
//!     reqwest::header::HeaderMap::new(),
//!     Duration::from_secs(10),
//! )
//! .await?;
//! let client = ().serve(transport).await?;
//! let tools = client.list_all_tools().await?;
//! # drop(tools);
//! # Ok(())
//! # }
//! ```

use std::{fmt, sync::Arc, time::Duration};

use futures::StreamExt;
use quiver_sse::{EventStream, Sse, bounded_event_stream};
use reqwest::{
    StatusCode,
    header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE, HeaderMap, HeaderValue},
};
use rmcp::{
    RoleClient,
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::Transport,
};
use url::Url;

/// Largest SSE event accepted from a server. Without a bound a server that never ends a
/// line would grow the parser's buffer until the worker runs out of memory; the value
/// matches rmcp's own limit for streamable HTTP.
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// How much of an error response body is kept for diagnostics.
const ERROR_BODY_EXCERPT_BYTES: usize = 512;

/// How much of a success response body is read so the connection can be reused.
const DRAIN_BODY_BYTES: usize = 64 * 1024;

/// How much of a server-supplied endpoint string is quoted in errors.
const ENDPOINT_EXCERPT_CHARS: usize = 200;

/// Failures of the legacy SSE client transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LegacySseError {
    /// The GET of the SSE URL failed before a response arrived.
    #[error("cannot open sse stream: {0}")]
    Connect(#[source] reqwest::Error),
    /// The SSE URL answered with a non-success status.
    #[error("sse url answered with status {status}")]
    ConnectStatus {
        /// The status of the GET response.
        status: StatusCode,
    },
    /// The SSE URL answered with something other than an event stream.
    #[error("sse url answered with content type {content_type:?}, not text/event-stream")]
    NotEventStream {
        /// The `Content-Type` of the response, if any.
        content_type: Option<String>,
    },
    /// No `endpoint` event arrived within the connect timeout.
    #[error("no endpoint event within {timeout:?}")]
    ConnectTimeout {
        /// The connect timeout that elapsed.
        timeout: Duration,
    },
    /// The SSE stream ended before announcing the endpoint.
    #[error("sse stream ended before the endpoint event")]
    StreamEndedBeforeEndpoint,
    /// The SSE stream was malformed or broke before announcing the endpoint.
    #[error("sse stream failed before the endpoint event: {0}")]
    Sse(#[source] quiver_sse::Error),
    /// The `endpoint` event carried no URL.
    #[error("endpoint event carries no url")]
    EmptyEndpoint,
    /// The `endpoint` event carried something that is not a URL.
    #[error("endpoint {endpoint:?} is not a valid url: {source}")]
    InvalidEndpoint {
        /// The start of the announced endpoint.
        endpoint: String,
        /// Why it did not parse.
        #[source]
        source: url::ParseError,
    },
    /// The `endpoint` event pointed at another origin. Following it would let a server
    /// send the registry's credentials, and the worker's traffic, to a host nobody
    /// registered.
    #[error("endpoint {endpoint} is not on the sse url's origin {expected_origin}")]
    CrossOriginEndpoint {
        /// The start of the resolved endpoint.
        endpoint: String,
        /// The origin of the SSE URL, the only one accepted.
        expected_origin: String,
    },
    /// A client message could not be serialized.
    #[error("cannot serialize message: {0}")]
    Serialize(#[source] serde_json::Error),
    /// The POST of a message failed before a response arrived.
    #[error("cannot post message: {0}")]
    Post(#[source] reqwest::Error),
    /// The message endpoint answered a POST with a non-success status.
    #[error("message endpoint answered with status {status}: {body:?}")]
    PostStatus {
        /// The status of the POST response.
        status: StatusCode,
        /// The start of the response body, for diagnostics.
        body: String,
    },
}

/// An rmcp client transport speaking the legacy HTTP+SSE protocol.
///
/// Created by [`LegacySseClientTransport::connect`]; hand it to
/// `rmcp::ServiceExt::serve` to get a `RunningService<RoleClient, _>`. Dropping or
/// closing it closes the SSE connection, which ends the server's session.
pub struct LegacySseClientTransport {
    /// `None` once the stream ended or failed, so rmcp keeps seeing a closed transport.
    events: Option<EventStream>,
    poster: Arc<Poster>,
}

impl fmt::Debug for LegacySseClientTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LegacySseClientTransport")
            .field("endpoint", &self.poster.endpoint.as_str())
            .field("open", &self.events.is_some())
            .finish_non_exhaustive()
    }
}

/// What a send needs; shared so that rmcp can run sends concurrently with `'static`
/// futures while `receive` keeps the stream.
struct Poster {
    client: reqwest::Client,
    endpoint: Url,
    headers: HeaderMap,
}

impl LegacySseClientTransport {
    /// Opens the SSE stream at `sse_url` and waits for the server's `endpoint` event.
    ///
    /// `headers` are sent with the GET and with every POST (e.g. `Authorization`).
    /// `connect_timeout` bounds the whole handshake: the GET and the wait for the
    /// endpoint. Timeouts of later POSTs are those configured on `client`. The endpoint
    /// is resolved against `sse_url` and refused unless it has the same origin.
    ///
    /// `client` must not carry a total request timeout or a read timeout shorter than
    /// the server's silences: either would also cut the long-lived event stream (the
    /// reference TypeScript server sends no keep-alives). Per-call deadlines belong to
    /// the caller.
    pub async fn connect(
        client: reqwest::Client,
        sse_url: Url,
        headers: HeaderMap,
        connect_timeout: Duration,
    ) -> Result<Self, LegacySseError> {
        tokio::time::timeout(connect_timeout, Self::handshake(client, sse_url, headers))
            .await
            .unwrap_or(Err(LegacySseError::ConnectTimeout {
                timeout: connect_timeout,
            }))
    }

    /// The URL messages are POSTed to, as announced by the server.
    pub fn endpoint(&self) -> &Url {
        &self.poster.endpoint
    }

    async fn handshake(
        client: reqwest::Client,
        sse_url: Url,
        headers: HeaderMap,
    ) -> Result<Self, LegacySseError> {
        let mut get_headers = headers.clone();
        get_headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        get_headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        let response = client
            .get(sse_url.clone())
            .headers(get_headers)
            .send()
            .await
            .map_err(LegacySseError::Connect)?;
        let status = response.status();
        if !status.is_success() {
            return Err(LegacySseError::ConnectStatus { status });
        }
        // Like EventSource: a 200 HTML page (a login portal, a wrong path behind a
        // catch-all route) must fail loudly rather than wait out the timeout.
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
        if !content_type.as_deref().is_some_and(is_event_stream) {
            return Err(LegacySseError::NotEventStream { content_type });
        }

        let mut events = bounded_event_stream(response.bytes_stream(), MAX_EVENT_BYTES);
        let announced = loop {
            match events.next().await {
                None => return Err(LegacySseError::StreamEndedBeforeEndpoint),
                Some(Err(error)) => return Err(LegacySseError::Sse(error)),
                Some(Ok(event)) if event.event.as_deref() == Some("endpoint") => {
                    break event.data.unwrap_or_default();
                }
                Some(Ok(event)) => {
                    tracing::debug!(event = ?event.event, "ignoring sse event before the endpoint event");
                }
            }
        };
        let endpoint = resolve_endpoint(&sse_url, &announced)?;
        tracing::debug!(%sse_url, %endpoint, "legacy sse session opened");

        Ok(Self {
            events: Some(events),
            poster: Arc::new(Poster {
                client,
                endpoint,
                headers,
            }),
        })
    }
}

impl Transport<RoleClient> for LegacySseClientTransport {
    type Error = LegacySseError;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let poster = Arc::clone(&self.poster);
        async move { poster.post(&item).await }
    }

    // rmcp polls this inside `select!` and drops it whenever another branch wins, so it
    // must be cancel-safe: the only await is `next()` on the stream, and an event is
    // fully handled before the next await.
    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        let events = self.events.as_mut()?;
        loop {
            match events.next().await {
                None => {
                    tracing::debug!(endpoint = %self.poster.endpoint, "legacy sse stream ended");
                    self.events = None;
                    return None;
                }
                // After a parse error sse-stream has dropped the rest of the chunk, so a
                // message may be lost; closing lets the caller reconnect instead of
                // waiting for a response that will never come.
                Some(Err(error)) => {
                    tracing::warn!(endpoint = %self.poster.endpoint, %error, "legacy sse stream failed, closing transport");
                    self.events = None;
                    return None;
                }
                Some(Ok(event)) => {
                    if let Some(message) = decode_message(event) {
                        return Some(message);
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Dropping the body closes the GET connection, which is how the server learns
        // the session is over.
        self.events = None;
        Ok(())
    }
}

impl Poster {
    async fn post(&self, message: &ClientJsonRpcMessage) -> Result<(), LegacySseError> {
        let body = serde_json::to_vec(message).map_err(LegacySseError::Serialize)?;
        let mut headers = self.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let mut response = self
            .client
            .post(self.endpoint.clone())
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(LegacySseError::Post)?;
        let status = response.status();
        if status.is_success() {
            // Reading the short "Accepted" body returns the connection to the pool.
            read_prefix(&mut response, DRAIN_BODY_BYTES).await;
            return Ok(());
        }
        let excerpt = read_prefix(&mut response, ERROR_BODY_EXCERPT_BYTES).await;
        Err(LegacySseError::PostStatus {
            status,
            body: String::from_utf8_lossy(&excerpt).into_owned(),
        })
    }
}

/// Reads at most `limit` bytes of a body; errors only end the read, since the body is
/// either diagnostics or something to discard.
async fn read_prefix(response: &mut reqwest::Response, limit: usize) -> Vec<u8> {
    let mut prefix = Vec::new();
    while prefix.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(limit - prefix.len());
                prefix.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    prefix
}

fn is_event_stream(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"))
}

fn resolve_endpoint(sse_url: &Url, announced: &str) -> Result<Url, LegacySseError> {
    let announced = announced.trim();
    if announced.is_empty() {
        return Err(LegacySseError::EmptyEndpoint);
    }
    let endpoint = sse_url
        .join(announced)
        .map_err(|source| LegacySseError::InvalidEndpoint {
            endpoint: announced.chars().take(ENDPOINT_EXCERPT_CHARS).collect(),
            source,
        })?;
    if endpoint.origin() != sse_url.origin() {
        return Err(LegacySseError::CrossOriginEndpoint {
            endpoint: endpoint
                .as_str()
                .chars()
                .take(ENDPOINT_EXCERPT_CHARS)
                .collect(),
            expected_origin: sse_url.origin().ascii_serialization(),
        });
    }
    Ok(endpoint)
}

/// Turns one SSE event into a server message, or `None` for events that carry none.
fn decode_message(event: Sse) -> Option<ServerJsonRpcMessage> {
    // An event without a type is a `message` event by the SSE specification.
    match event.event.as_deref() {
        None | Some("message") => {}
        Some("endpoint") => {
            tracing::debug!("ignoring repeated endpoint event");
            return None;
        }
        Some(other) => {
            tracing::debug!(event = other, "ignoring unknown sse event type");
            return None;
        }
    }
    let data = event.data?;
    match serde_json::from_str::<ServerJsonRpcMessage>(&data) {
        Ok(message) => Some(message),
        Err(error) => {
            tracing::warn!(%error, bytes = data.len(), "skipping sse message that is not a json-rpc message");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_resolution() {
        let sse: Url = "http://127.0.0.1:8080/mcp/sse?x=1".parse().unwrap();
        let resolved = resolve_endpoint(&sse, " /message?sessionId=abc\n").unwrap();
        assert_eq!(
            resolved.as_str(),
            "http://127.0.0.1:8080/message?sessionId=abc"
        );
        let resolved = resolve_endpoint(&sse, "messages?id=1").unwrap();
        assert_eq!(resolved.as_str(), "http://127.0.0.1:8080/mcp/messages?id=1");
        let absolute = resolve_endpoint(&sse, "http://127.0.0.1:8080/m").unwrap();
        assert_eq!(absolute.as_str(), "http://127.0.0.1:8080/m");

        for foreign in [
            "http://evil.example/message",
            "//evil.example/message",
            "https://127.0.0.1:8080/message",
            "http://127.0.0.1:8081/message",
            "data:text/plain,hi",
        ] {
            assert!(
                matches!(
                    resolve_endpoint(&sse, foreign),
                    Err(LegacySseError::CrossOriginEndpoint { .. })
                ),
                "{foreign}"
            );
        }
        assert!(matches!(
            resolve_endpoint(&sse, "  "),
            Err(LegacySseError::EmptyEndpoint)
        ));
        assert!(matches!(
            resolve_endpoint(&sse, "http://[::1"),
            Err(LegacySseError::InvalidEndpoint { .. })
        ));
    }

    #[test]
    fn decode_skips_everything_but_json_rpc_messages() {
        let response = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
        let event = |kind: Option<&str>, data: Option<&str>| Sse {
            event: kind.map(str::to_owned),
            data: data.map(str::to_owned),
            ..Sse::default()
        };
        assert!(decode_message(event(Some("message"), Some(response))).is_some());
        assert!(decode_message(event(None, Some(response))).is_some());
        assert!(decode_message(event(Some("endpoint"), Some(response))).is_none());
        assert!(decode_message(event(Some("ping"), Some(response))).is_none());
        assert!(decode_message(event(Some("message"), None)).is_none());
        assert!(decode_message(event(Some("message"), Some("not json"))).is_none());
        assert!(decode_message(event(Some("message"), Some(r#"{"hello":1}"#))).is_none());
        assert!(decode_message(event(Some("message"), Some("[]"))).is_none());
    }

    #[test]
    fn content_type_check() {
        assert!(is_event_stream("text/event-stream"));
        assert!(is_event_stream("Text/Event-Stream; charset=utf-8"));
        assert!(!is_event_stream("text/html"));
        assert!(!is_event_stream(""));
    }
}
