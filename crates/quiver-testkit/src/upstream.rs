//! A scripted OpenAI-compatible upstream: a real HTTP server speaking the
//! Chat Completions API whose answers each test scripts in advance, and which
//! records every request it receives.
//!
//! [`ScriptedUpstream`] serves `POST /v1/chat/completions` (and
//! `POST /chat/completions`) on `127.0.0.1:<ephemeral port>`. Every request is
//! recorded first and then answered with the [`Reply`] the [`Script`] gives
//! for its index (0-based, counting every recorded request, including the
//! ones answered 400 because their body is not a JSON request).
//!
//! Answers follow the API's shapes closely enough for real clients:
//!
//! - without `"stream": true`, one `chat.completion` object;
//! - with it, `text/event-stream` events of `chat.completion.chunk` objects,
//!   each written to the socket on its own, ending with `data: [DONE]`. Text
//!   is sent in `max(3, ⌈chars/16⌉)` pieces and every tool call's arguments
//!   in `max(2, ⌈chars/16⌉)` pieces, split on character boundaries;
//! - usage is deterministic: [`PROMPT_TOKENS_PER_MESSAGE`] per request
//!   message, and [`COMPLETION_TOKENS_PER_ITEM`] for a text reply or per tool
//!   call of a tool-calls reply (at least one item per reply);
//! - errors carry an OpenAI-style body `{"error": {"message", "type",
//!   "param": null, "code"}}`, where `code` is the HTTP status as a string
//!   and `type` is `rate_limit_error` (429), `server_error` (5xx) or
//!   `invalid_request_error`.

use std::{
    convert::Infallible,
    net::SocketAddr,
    os::fd::AsFd as _,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::{ConnectInfo, DefaultBodyLimit, State, connect_info::Connected},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse as _, Response},
    routing::post,
    serve::{IncomingStream, Listener, ListenerExt as _},
};
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Prompt tokens counted per message of the request.
pub const PROMPT_TOKENS_PER_MESSAGE: u64 = 10;

/// Completion tokens counted for a text reply, or per tool call of a
/// tool-calls reply (a reply without calls still counts one item).
pub const COMPLETION_TOKENS_PER_ITEM: u64 = 5;

/// Error message of the 500 answer given once a [`Script::Sequence`] has no
/// replies left.
pub const EXHAUSTED_MESSAGE: &str = "scripted upstream: script exhausted";

/// Characters per streamed piece of text or tool-call arguments, above the
/// minimum number of pieces.
const STREAM_PIECE_CHARS: usize = 16;

/// One tool call an assistant reply asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedToolCall {
    /// The call id (`call_…` in OpenAI's answers).
    pub id: String,
    /// The function (tool) name.
    pub name: String,
    /// The arguments exactly as sent: normally a JSON object, but possibly
    /// deliberately malformed.
    pub arguments: String,
}

impl ScriptedToolCall {
    /// A call whose arguments are `arguments` serialized as JSON.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        ScriptedToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.to_string(),
        }
    }

    /// A call whose arguments string is sent unchanged, valid JSON or not.
    pub fn raw(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        ScriptedToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }
}

/// What the upstream answers to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Assistant text, `finish_reason` `"stop"`.
    Text(String),
    /// Assistant tool calls, with optional text alongside; `finish_reason`
    /// `"tool_calls"`.
    ToolCalls {
        /// Text sent with the calls; `None` sends `content: null`.
        content: Option<String>,
        /// The calls, in order.
        calls: Vec<ScriptedToolCall>,
    },
    /// An error status with an OpenAI-style body, before any body for
    /// streaming requests too.
    Error {
        /// HTTP status; one outside 100..=999 is answered 500 instead.
        status: u16,
        /// `error.message` of the body.
        message: String,
        /// Seconds for a `Retry-After` header.
        retry_after: Option<u64>,
    },
    /// Waits, then answers with the inner reply.
    Delay(Duration, Box<Reply>),
    /// Closes the connection without answering, as a network failure would.
    Disconnect,
}

impl Reply {
    /// [`Reply::Text`].
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Text(text.into())
    }

    /// One tool call, without text; `arguments` is serialized as JSON.
    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Reply {
        Reply::tool_calls(vec![ScriptedToolCall::new(id, name, arguments)])
    }

    /// Several tool calls, without text.
    pub fn tool_calls(calls: Vec<ScriptedToolCall>) -> Reply {
        Reply::ToolCalls {
            content: None,
            calls,
        }
    }

    /// An error status without `Retry-After`.
    pub fn error(status: u16, message: impl Into<String>) -> Reply {
        Reply::Error {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// This reply, sent after `delay`.
    pub fn delayed(self, delay: Duration) -> Reply {
        Reply::Delay(delay, Box::new(self))
    }
}

/// Computes a reply from the recorded request and its 0-based index.
pub type Responder = Arc<dyn Fn(&RecordedRequest, usize) -> Reply + Send + Sync>;

/// How the upstream answers its requests.
#[derive(Clone)]
pub enum Script {
    /// Replies in request order; once exhausted, every request is answered
    /// 500 with [`EXHAUSTED_MESSAGE`].
    Sequence(Vec<Reply>),
    /// A reply computed per request. It runs on the server's task: it should
    /// be quick, and a panic in it drops that request's connection.
    Respond(Responder),
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Script::Sequence(replies) => f.debug_tuple("Sequence").field(replies).finish(),
            Script::Respond(_) => f.write_str("Respond(..)"),
        }
    }
}

impl Script {
    /// [`Script::Sequence`].
    pub fn sequence(replies: impl IntoIterator<Item = Reply>) -> Script {
        Script::Sequence(replies.into_iter().collect())
    }

    /// [`Script::Respond`].
    pub fn respond(f: impl Fn(&RecordedRequest, usize) -> Reply + Send + Sync + 'static) -> Script {
        Script::Respond(Arc::new(f))
    }

    fn reply(&self, request: &RecordedRequest, index: usize) -> Reply {
        match self {
            Script::Sequence(replies) => replies
                .get(index)
                .cloned()
                .unwrap_or_else(|| Reply::error(500, EXHAUSTED_MESSAGE)),
            Script::Respond(respond) => respond(request, index),
        }
    }
}

/// Knobs of a [`ScriptedUpstream`]; `UpstreamOptions::default()` equals
/// [`UpstreamOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamOptions {
    /// Keep each request's body (`raw` and parsed `body`). When `false`
    /// (benchmark mode) bodies are read and only scanned for the fields the
    /// answer depends on; recorded requests keep headers and arrival time,
    /// with an empty `raw` and a `Null` `body`.
    pub record_bodies: bool,
    /// Pause before each streamed event, to make streams observably slow.
    /// `None` still writes each event on its own, without waiting.
    pub chunk_delay: Option<Duration>,
}

impl Default for UpstreamOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl UpstreamOptions {
    /// Records bodies, streams without pauses.
    pub fn new() -> Self {
        UpstreamOptions {
            record_bodies: true,
            chunk_delay: None,
        }
    }

    /// Sets [`record_bodies`](Self::record_bodies).
    pub fn with_record_bodies(mut self, record_bodies: bool) -> Self {
        self.record_bodies = record_bodies;
        self
    }

    /// Sets [`chunk_delay`](Self::chunk_delay).
    pub fn with_chunk_delay(mut self, chunk_delay: Option<Duration>) -> Self {
        self.chunk_delay = chunk_delay;
        self
    }
}

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// The request headers.
    pub headers: HeaderMap,
    /// The body bytes (empty unless [`UpstreamOptions::record_bodies`]).
    pub raw: Bytes,
    /// The size of the body in bytes, recorded even when the body is not.
    pub size: usize,
    /// The body parsed as JSON; `Null` when it is not JSON or bodies are not
    /// recorded.
    pub body: Value,
    /// When the whole request had arrived.
    pub received_at: Instant,
}

/// The fields of a request body the answer depends on.
#[derive(Debug, Default, Deserialize)]
struct RequestShape {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    /// Only counted: `IgnoredAny` is zero-sized, so the vector never
    /// allocates.
    #[serde(default)]
    messages: Option<Vec<serde::de::IgnoredAny>>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Debug)]
struct Shared {
    script: Script,
    options: UpstreamOptions,
    requests: Mutex<Vec<Arc<RecordedRequest>>>,
    shutdown: CancellationToken,
}

impl Shared {
    /// Appends `request` and returns its index; one lock keeps indexes equal
    /// to positions in arrival order.
    fn record(&self, request: RecordedRequest) -> (usize, Arc<RecordedRequest>) {
        let request = Arc::new(request);
        let mut requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        requests.push(request.clone());
        (requests.len() - 1, request)
    }
}

/// A running scripted upstream; stopped when dropped.
#[derive(Debug)]
pub struct ScriptedUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl ScriptedUpstream {
    /// Starts serving `POST /v1/chat/completions` (also
    /// `POST /chat/completions`) with default [`UpstreamOptions`].
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(script: Script) -> ScriptedUpstream {
        Self::start_with(script, UpstreamOptions::new()).await
    }

    /// Like [`start`](Self::start), with `options`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start_with(script: Script, options: UpstreamOptions) -> ScriptedUpstream {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("scripted upstream: bind 127.0.0.1:0");
        let addr = listener
            .local_addr()
            .expect("scripted upstream: local address");
        let shared = Arc::new(Shared {
            script,
            options,
            requests: Mutex::default(),
            shutdown: CancellationToken::new(),
        });
        let router = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .route("/chat/completions", post(chat_completions))
            // Tool results relayed by a worker can exceed axum's 2 MB default.
            .layer(DefaultBodyLimit::disable())
            .with_state(shared.clone());
        let serve = axum::serve(
            HandleListener(listener.tap_io(crate::mcp_server::no_delay)),
            router.into_make_service_with_connect_info::<ConnectionHandle>(),
        )
        .with_graceful_shutdown(shared.shutdown.clone().cancelled_owned());
        let task = tokio::spawn(async move { serve.await });
        ScriptedUpstream { addr, shared, task }
    }

    /// The base URL clients are configured with, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The full endpoint, `http://127.0.0.1:PORT/v1/chat/completions`.
    pub fn chat_completions_url(&self) -> String {
        format!("{}/chat/completions", self.base_url())
    }

    /// The address the upstream listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock_requests()
            .iter()
            .map(|request| RecordedRequest::clone(request))
            .collect()
    }

    /// How many requests were received so far.
    pub fn request_count(&self) -> usize {
        self.lock_requests().len()
    }

    /// Stops accepting requests, cuts pending delays and streams short, and
    /// waits for the server task to finish.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        match (&mut self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!("scripted upstream: server failed: {err}"),
            Err(err) => tracing::warn!("scripted upstream: server task failed: {err}"),
        }
    }

    fn lock_requests(&self) -> std::sync::MutexGuard<'_, Vec<Arc<RecordedRequest>>> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// A second descriptor of a connection's socket, so a handler can close the
/// connection it is answering: axum offers no other way to end one without
/// sending a response.
#[derive(Debug, Clone)]
struct ConnectionHandle(Option<Arc<std::net::TcpStream>>);

impl<L> Connected<IncomingStream<'_, HandleListener<L>>> for ConnectionHandle
where
    L: Listener<Io = TcpStream>,
{
    fn connect_info(stream: IncomingStream<'_, HandleListener<L>>) -> Self {
        let socket = stream.io().as_fd().try_clone_to_owned();
        ConnectionHandle(
            socket
                .ok()
                .map(|fd| Arc::new(std::net::TcpStream::from(fd))),
        )
    }
}

/// Forwards to the listener it wraps. It exists because axum already
/// implements `Connected` for every `TapIo` stream (for the address type),
/// which leaves no room for [`ConnectionHandle`] on `TapIo` itself.
struct HandleListener<L>(L);

impl<L> Listener for HandleListener<L>
where
    L: Listener<Io = TcpStream>,
{
    type Io = TcpStream;
    type Addr = L::Addr;

    fn accept(&mut self) -> impl Future<Output = (TcpStream, L::Addr)> + Send {
        self.0.accept()
    }

    fn local_addr(&self) -> std::io::Result<L::Addr> {
        self.0.local_addr()
    }
}

impl ConnectionHandle {
    /// Shuts the socket down both ways: the client sees the connection close
    /// before any byte of a response.
    fn disconnect(&self) -> Response {
        let result = match &self.0 {
            Some(socket) => socket.shutdown(std::net::Shutdown::Both),
            None => Err(std::io::Error::other("no socket descriptor")),
        };
        match result {
            // hyper fails to write this once the socket is shut down.
            Ok(()) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            Err(err) => error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("scripted upstream: cannot disconnect: {err}"),
                None,
            ),
        }
    }
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(connection): ConnectInfo<ConnectionHandle>,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    let received_at = Instant::now();
    let shape = serde_json::from_slice::<RequestShape>(&raw);
    let size = raw.len();
    let (raw, body) = match shared.options.record_bodies {
        true => {
            let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
            (raw, body)
        }
        false => (Bytes::new(), Value::Null),
    };
    let (index, request) = shared.record(RecordedRequest {
        headers,
        raw,
        size,
        body,
        received_at,
    });
    let shape = match shape {
        Ok(shape) => shape,
        Err(err) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                &format!("scripted upstream: request body is not a JSON chat request: {err}"),
                None,
            );
        }
    };
    let mut reply = shared.script.reply(&request, index);
    loop {
        return match reply {
            Reply::Delay(delay, inner) => {
                tokio::select! {
                    () = tokio::time::sleep(delay) => reply = *inner,
                    () = shared.shutdown.cancelled() => return connection.disconnect(),
                }
                continue;
            }
            Reply::Text(text) => complete(&shared, index, &shape, Some(&text), None),
            Reply::ToolCalls { content, calls } => {
                complete(&shared, index, &shape, content.as_deref(), Some(&calls))
            }
            Reply::Error {
                status,
                message,
                retry_after,
            } => match StatusCode::from_u16(status) {
                Ok(status) => error_response(status, &message, retry_after),
                Err(_) => error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("scripted upstream: invalid scripted status {status}: {message}"),
                    retry_after,
                ),
            },
            Reply::Disconnect => connection.disconnect(),
        };
    }
}

fn error_response(status: StatusCode, message: &str, retry_after: Option<u64>) -> Response {
    let kind = if status == StatusCode::TOO_MANY_REQUESTS {
        "rate_limit_error"
    } else if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    let body = json!({"error": {
        "message": message,
        "type": kind,
        "param": null,
        "code": status.as_u16().to_string(),
    }});
    let mut response = (status, Json(body)).into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// The parts of a successful answer shared by both encodings.
struct Completion<'a> {
    id: String,
    created: u64,
    model: &'a str,
    content: Option<&'a str>,
    calls: &'a [ScriptedToolCall],
    finish_reason: &'static str,
    usage: Value,
}

/// Answers with `content` and, for a tool-calls reply, `calls`.
fn complete(
    shared: &Shared,
    index: usize,
    shape: &RequestShape,
    content: Option<&str>,
    calls: Option<&[ScriptedToolCall]>,
) -> Response {
    let messages = shape.messages.as_ref().map_or(0, Vec::len) as u64;
    let items = calls.map_or(1, |calls| calls.len().max(1)) as u64;
    let prompt_tokens = messages * PROMPT_TOKENS_PER_MESSAGE;
    let completion_tokens = items * COMPLETION_TOKENS_PER_ITEM;
    let completion = Completion {
        id: format!("chatcmpl-scripted-{index}"),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs()),
        model: shape.model.as_deref().unwrap_or("scripted"),
        content,
        calls: calls.unwrap_or_default(),
        finish_reason: if calls.is_some() {
            "tool_calls"
        } else {
            "stop"
        },
        usage: json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }),
    };
    if shape.stream != Some(true) {
        return Json(completion.object()).into_response();
    }
    let include_usage = shape
        .stream_options
        .as_ref()
        .and_then(|options| options.include_usage)
        == Some(true);
    let events = completion.events(include_usage);
    let delay = shared.options.chunk_delay;
    // Suspending before every event makes hyper flush each one on its own,
    // as a real upstream produces them, instead of coalescing ready chunks.
    let stream = futures::stream::iter(events)
        .then(move |event| async move {
            match delay {
                Some(delay) => tokio::time::sleep(delay).await,
                None => tokio::task::yield_now().await,
            }
            Ok::<_, Infallible>(event)
        })
        .take_until(shared.shutdown.clone().cancelled_owned());
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

impl Completion<'_> {
    /// The non-streaming `chat.completion` object.
    fn object(&self) -> Value {
        let mut message = json!({"role": "assistant", "content": self.content});
        if !self.calls.is_empty() {
            let calls: Vec<Value> = self
                .calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    })
                })
                .collect();
            message["tool_calls"] = Value::Array(calls);
        }
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": message,
                "finish_reason": self.finish_reason,
            }],
            "usage": self.usage,
        })
    }

    /// Every server-sent event of the streaming answer, `[DONE]` included.
    fn events(&self, include_usage: bool) -> Vec<Bytes> {
        let chunk = |choices: Value| {
            let mut chunk = json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": choices,
            });
            // As OpenAI does: with include_usage every chunk has the key,
            // null until the final usage chunk.
            if include_usage {
                chunk["usage"] = Value::Null;
            }
            chunk
        };
        let delta =
            |delta: Value| chunk(json!([{"index": 0, "delta": delta, "finish_reason": null}]));

        let mut chunks = vec![delta(json!({"role": "assistant", "content": ""}))];
        if let Some(content) = self.content {
            chunks.extend(
                split_chars(content, 3)
                    .into_iter()
                    .map(|piece| delta(json!({"content": piece}))),
            );
        }
        for (index, call) in self.calls.iter().enumerate() {
            chunks.push(delta(json!({"tool_calls": [{
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }]})));
            chunks.extend(split_chars(&call.arguments, 2).into_iter().map(|piece| {
                delta(json!({"tool_calls": [{
                    "index": index,
                    "function": {"arguments": piece},
                }]}))
            }));
        }
        chunks.push(chunk(json!([{
            "index": 0,
            "delta": {},
            "finish_reason": self.finish_reason,
        }])));
        if include_usage {
            let mut usage = chunk(json!([]));
            usage["usage"] = self.usage.clone();
            chunks.push(usage);
        }

        let mut events: Vec<Bytes> = chunks
            .iter()
            .map(|chunk| Bytes::from(format!("data: {chunk}\n\n")))
            .collect();
        events.push(Bytes::from_static(b"data: [DONE]\n\n"));
        events
    }
}

/// Splits `text` into `max(min_pieces, ⌈chars/16⌉)` pieces of nearly equal
/// character counts; pieces of a text shorter than that are empty.
fn split_chars(text: &str, min_pieces: usize) -> Vec<&str> {
    let mut bounds: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
    bounds.push(text.len());
    let chars = bounds.len() - 1;
    let pieces = min_pieces.max(chars.div_ceil(STREAM_PIECE_CHARS));
    (0..pieces)
        .map(|piece| {
            let start = bounds[piece * chars / pieces];
            let end = bounds[(piece + 1) * chars / pieces];
            &text[start..end]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_chars_keeps_every_char_once() {
        for text in ["", "a", "ab", "héllo wörld", &"€".repeat(100)] {
            let pieces = split_chars(text, 3);
            assert!(pieces.len() >= 3, "{text:?}: {pieces:?}");
            assert_eq!(pieces.concat(), text);
        }
        assert_eq!(split_chars("abcdef", 3), ["ab", "cd", "ef"]);
        assert_eq!(split_chars("ab", 3), ["", "a", "b"]);
        assert_eq!(split_chars(&"x".repeat(100), 2).len(), 7);
    }
}
