//! `tools/call` on a streamable-HTTP connection, posted by the task that
//! awaits it (issue #23; `benches/http_upstream.rs` of `quiver-worker`).
//!
//! rmcp's client hands each request from its caller to its service task,
//! from there to its transport worker (one task per connection, which every
//! request of the connection passes through) and the answer back the same
//! way: four hand-offs between tasks per call, and under many callers one
//! task that every call of a server waits for. A call sent here is posted
//! with the connection's own HTTP client — the same credentials, egress
//! check, headers and response limits, see [`crate::sse_answer`] — where it
//! is awaited, and its answer is read there.
//!
//! What rmcp's client does besides is kept:
//! - messages the server sends before the answer (progress, log messages,
//!   list changes, or a request: elicitation, sampling, roots) go to the
//!   connection's [`ClientSide`] as rmcp's service hands them on; a
//!   server's request is answered with a `POST` of its own, and the server
//!   may cancel it (`notifications/cancelled`) while it waits;
//! - a stream that ends before the answer is resumed with `Last-Event-ID`
//!   (SEP-1699), at most [`MAX_RESUMES`] times;
//! - a session the server no longer knows (404): the server never saw the
//!   call, so it goes to rmcp, which opens a new session and sends it there
//!   (the call's progress relayed under the token rmcp sends it with).
//!
//! Calls that rmcp sends as before: on stdio and legacy SSE; on a session
//! whose id has not been seen yet ([`SeenSession`]); of a 2026-07-28
//! tool whose name would need encoding in `Mcp-Name` or whose input schema
//! asks for `Mcp-Param-*` headers (`x-mcp-header`), which rmcp derives.
//! Request ids and progress tokens here start at [`DIRECT_IDS`], far above
//! rmcp's counter for the same connection, so the two never meet.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{BoxStream, FuturesUnordered, StreamExt as _};
use http::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientJsonRpcMessage, ClientRequest,
    JsonRpcNotification, JsonRpcRequest, NumberOrString, ProgressToken, ProtocolVersion, RequestId,
    RequestMetaObject, ServerJsonRpcMessage, ServerNotification, ServerRequest,
};
use rmcp::model::{GetExtensions as _, GetMeta as _};
use rmcp::service::{Peer, RequestContext, ServiceError};
use rmcp::transport::DynamicTransportError;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use rmcp::{RoleClient, Service as _};
use tokio_util::sync::CancellationToken;

use crate::client_side::ClientSide;
use crate::inflight::Answer;
use crate::sse_answer::{AnswerFirst, SeenSession};

/// The first request id (and progress token) of calls sent here.
pub const DIRECT_IDS: i64 = 1 << 40;
/// Times a stream that ended before its answer is resumed.
pub const MAX_RESUMES: usize = 3;
/// Requests of the server one call's stream may have open at once; more
/// are refused (each waits for the caller, so a flood would pile up).
pub const MAX_OPEN_REQUESTS: usize = 16;
/// Longest wait before resuming, whatever `retry` the server asked for.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(1);

type SseStream = BoxStream<'static, Result<sse_stream::Sse, sse_stream::Error>>;

/// Why a `POST` or a resumption failed.
enum PostError {
    /// The server no longer knows the session (it never saw the request).
    SessionExpired,
    Failed(ServiceError),
}

impl PostError {
    /// What the caller is told: a forgotten session met here (a stream's
    /// resumption) ends the call as a closed connection does.
    fn into_service_error(self) -> ServiceError {
        match self {
            PostError::SessionExpired => ServiceError::TransportClosed,
            PostError::Failed(err) => err,
        }
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<StreamableHttpError<E>> for PostError {
    fn from(err: StreamableHttpError<E>) -> Self {
        match err {
            StreamableHttpError::SessionExpired => PostError::SessionExpired,
            // As rmcp reports a failed send, so that what callers read off
            // it (an authorization challenge, say) is found the same way.
            other => PostError::Failed(ServiceError::TransportSend(
                DynamicTransportError::from_parts(
                    "streamable-http",
                    std::any::TypeId::of::<E>(),
                    Box::new(other),
                ),
            )),
        }
    }
}

/// What a `POST` needs besides its message.
#[derive(Clone)]
struct Target {
    uri: Arc<str>,
    auth_header: Option<String>,
    headers: HashMap<HeaderName, HeaderValue>,
    limits: StreamableHttpResponseLimits,
}

/// The connection's HTTP client, whatever its type.
trait Poster: Send + Sync {
    fn post(
        &self,
        target: Target,
        message: ClientJsonRpcMessage,
        session: Option<Arc<str>>,
    ) -> BoxFuture<'static, Result<StreamableHttpPostResponse, PostError>>;

    fn resume(
        &self,
        target: Target,
        session: Option<Arc<str>>,
        last_event_id: String,
    ) -> BoxFuture<'static, Result<SseStream, PostError>>;
}

impl<C: StreamableHttpClient + Sync> Poster for C {
    fn post(
        &self,
        target: Target,
        message: ClientJsonRpcMessage,
        session: Option<Arc<str>>,
    ) -> BoxFuture<'static, Result<StreamableHttpPostResponse, PostError>> {
        let client = self.clone();
        Box::pin(async move {
            Ok(client
                .post_message_with_response_limits(
                    target.uri,
                    message,
                    session,
                    target.auth_header,
                    target.headers,
                    target.limits,
                )
                .await?)
        })
    }

    fn resume(
        &self,
        target: Target,
        session: Option<Arc<str>>,
        last_event_id: String,
    ) -> BoxFuture<'static, Result<SseStream, PostError>> {
        let client = self.clone();
        Box::pin(async move {
            Ok(client
                .get_stream_with_max_sse_event_size(
                    target.uri,
                    session,
                    Some(last_event_id),
                    target.auth_header,
                    target.headers,
                    target.limits.max_sse_event_size,
                )
                .await?)
        })
    }
}

/// What [`DirectCalls::new`] takes from the transport before the
/// connection is open.
pub struct DirectParts {
    poster: Arc<dyn Poster>,
    target: Target,
    session: Arc<SeenSession>,
}

impl DirectParts {
    /// The parts of a transport built with `client` and `config`.
    pub fn new<C: StreamableHttpClient + Sync>(
        client: &AnswerFirst<C>,
        config: &rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig,
    ) -> Self {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = config.max_sse_event_size;
        limits.max_json_response_size = config.max_json_response_size;
        limits.max_error_response_size = config.max_error_response_size;
        DirectParts {
            poster: Arc::new(client.clone()),
            target: Target {
                uri: config.uri.clone(),
                auth_header: config.auth_header.clone(),
                headers: config.custom_headers.clone(),
                limits,
            },
            session: client.session.clone(),
        }
    }
}

/// Where a call is posted: its headers and session.
pub struct Posting {
    target: Target,
    session: Option<Arc<str>>,
}

/// A call sent here: what [`crate::inflight::InFlightCall`] keeps of it.
pub struct Sent {
    pub id: RequestId,
    pub progress_token: ProgressToken,
    pub answer: BoxFuture<'static, Answer>,
}

/// `tools/call` posted by its caller on one streamable-HTTP connection.
pub struct DirectCalls {
    poster: Arc<dyn Poster>,
    /// Headers with `MCP-Protocol-Version`.
    target: Target,
    session: Arc<SeenSession>,
    /// Requests carry their own `_meta` (2026-07-28 and later).
    stateless: bool,
    /// What a 2026-07-28 request's `_meta` says of the client (its
    /// protocol version, identity and capabilities), as rmcp stamps it.
    stamp: RequestMetaObject,
    side: ClientSide,
    peer: Peer<RoleClient>,
    next: AtomicI64,
}

impl DirectCalls {
    /// Calls on the connection `peer` opened with `parts`, at
    /// `protocol_version`, its server's traffic going to `side`.
    pub fn new(
        parts: DirectParts,
        protocol_version: ProtocolVersion,
        side: ClientSide,
        peer: Peer<RoleClient>,
    ) -> Self {
        let DirectParts {
            poster,
            mut target,
            session,
        } = parts;
        if let Ok(value) = HeaderValue::from_str(protocol_version.as_str()) {
            target
                .headers
                .insert(HeaderName::from_static("mcp-protocol-version"), value);
        }
        let info = rmcp::ClientHandler::get_info(&side);
        let mut stamp = RequestMetaObject::new();
        stamp.set_protocol_version(protocol_version.clone());
        stamp.set_client_info(info.client_info);
        stamp.set_client_capabilities(info.capabilities);
        DirectCalls {
            poster,
            target,
            session,
            stateless: protocol_version.as_str() >= ProtocolVersion::V_2026_07_28.as_str(),
            stamp,
            side,
            peer,
            next: AtomicI64::new(DIRECT_IDS),
        }
    }

    /// How a call of `tool` is posted, or `None` when rmcp must send it
    /// (see the module documentation).
    pub fn posting(&self, tool: &str) -> Option<Posting> {
        let mut target = self.target.clone();
        let session = if self.stateless {
            if !plain_header_value(tool) || !self.side.tools.plain_call(tool) {
                return None;
            }
            target.headers.insert(
                HeaderName::from_static("mcp-method"),
                HeaderValue::from_static("tools/call"),
            );
            target.headers.insert(
                HeaderName::from_static("mcp-name"),
                HeaderValue::from_str(tool).ok()?,
            );
            None
        } else {
            self.session.current()?
        };
        Some(Posting { target, session })
    }

    /// Posts `params` as `posting` says (`caller_meta` winning over the
    /// `_meta` a 2026-07-28 request carries).
    pub fn send(
        self: &Arc<Self>,
        posting: Posting,
        mut params: CallToolRequestParams,
        caller_meta: Option<RequestMetaObject>,
    ) -> Sent {
        let Posting { target, session } = posting;
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let id = RequestId::Number(number);
        let progress_token = ProgressToken(NumberOrString::Number(number));
        // A session's server may have forgotten it: then rmcp sends the call
        // as the caller made it.
        let resend = session
            .as_ref()
            .map(|_| (params.clone(), caller_meta.clone()));
        let mut meta = params.meta.take().unwrap_or_default();
        if self.stateless {
            meta.extend(self.stamp.clone());
        }
        if let Some(caller) = caller_meta {
            meta.extend(caller);
        }
        meta.set_progress_token(progress_token.clone());
        params.meta = Some(meta);
        let message = ClientJsonRpcMessage::request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            id.clone(),
        );
        let calls = self.clone();
        let answer_id = id.clone();
        let token = progress_token.clone();
        let answer = Box::pin(async move {
            let posted = calls
                .poster
                .post(target.clone(), message, session.clone())
                .await;
            match posted {
                Ok(StreamableHttpPostResponse::Json(message, _)) => {
                    answer_to(message, &answer_id).unwrap_or(Err(ServiceError::UnexpectedResponse))
                }
                Ok(StreamableHttpPostResponse::Sse(events, _)) => {
                    calls.read(events, &answer_id, target, session).await
                }
                Ok(_) => Err(ServiceError::UnexpectedResponse),
                Err(PostError::SessionExpired) if let Some((params, caller_meta)) = resend => {
                    calls.through_rmcp(params, caller_meta, &token).await
                }
                Err(err) => Err(err.into_service_error()),
            }
        });
        Sent {
            id,
            progress_token,
            answer,
        }
    }

    /// The call sent by rmcp instead; its progress, reported under the
    /// token rmcp gives it, still reaches the caller bound to `token`.
    async fn through_rmcp(
        &self,
        params: CallToolRequestParams,
        caller_meta: Option<RequestMetaObject>,
        token: &ProgressToken,
    ) -> Answer {
        let options = match caller_meta {
            Some(meta) => rmcp::service::PeerRequestOptions::no_options().with_meta(meta),
            None => rmcp::service::PeerRequestOptions::no_options(),
        };
        let unbound = self.side.relay.unbind_progress(token);
        let handle = self
            .peer
            .send_cancellable_request(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                options,
            )
            .await?;
        if let Some(call) = unbound {
            self.side.relay.bind(call, handle.progress_token.clone());
        }
        handle
            .rx
            .await
            .unwrap_or(Err(ServiceError::TransportClosed))
    }

    /// Reads the stream of a `POST` until the answer to `id`, handing on
    /// what comes before it and resuming a stream that ends early.
    async fn read(
        &self,
        mut events: SseStream,
        id: &RequestId,
        target: Target,
        session: Option<Arc<str>>,
    ) -> Answer {
        let mut asked = ServerRequests::default();
        let mut last_event_id = None;
        let mut retry = None;
        let mut resumes = 0;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                Some(()) = asked.answering.next(), if !asked.answering.is_empty() => continue,
            };
            let Some(event) = event else {
                let Some(from) = last_event_id.clone().filter(|_| resumes < MAX_RESUMES) else {
                    return Err(ServiceError::TransportClosed);
                };
                resumes += 1;
                if let Some(wait) = retry {
                    tokio::time::sleep(wait).await;
                }
                events = self
                    .poster
                    .resume(target.clone(), session.clone(), from)
                    .await
                    .map_err(PostError::into_service_error)?;
                continue;
            };
            let event = event.map_err(|err| {
                PostError::from(StreamableHttpError::<std::io::Error>::Sse(err))
                    .into_service_error()
            })?;
            if let Some(event_id) = event.id {
                last_event_id = Some(event_id);
            }
            if let Some(wait) = event.retry {
                retry = Some(Duration::from_millis(wait).min(MAX_RETRY_WAIT));
            }
            let Some(data) = event.data.filter(|data| !data.trim().is_empty()) else {
                continue;
            };
            let message = match serde_json::from_str::<ServerJsonRpcMessage>(&data) {
                Ok(message) => message,
                Err(err) => {
                    tracing::debug!(error = %err, "an undecodable message on a call's stream; skipped");
                    continue;
                }
            };
            let message = match answer_to(message, id) {
                Ok(answer) => return answer,
                Err(message) => message,
            };
            match *message {
                ServerJsonRpcMessage::Notification(notification) => {
                    self.notified(notification, &mut asked);
                }
                ServerJsonRpcMessage::Request(request) => {
                    let answering = self.answer_request(request, &mut asked, &target, &session);
                    asked.answering.push(answering);
                }
                // An answer to another request on this stream: not ours to read.
                _ => {}
            }
        }
    }

    /// Hands a notification on, as rmcp's service does; a cancellation of
    /// a request of the server still being answered stops it.
    fn notified(
        &self,
        notification: JsonRpcNotification<ServerNotification>,
        asked: &mut ServerRequests,
    ) {
        if let ServerNotification::CancelledNotification(cancelled) = &notification.notification
            && let Some(request_id) = &cancelled.params.request_id
            && let Some(token) = asked.cancel.remove(request_id)
        {
            token.cancel();
        }
        self.side.notified(notification.notification);
    }

    /// Answers a server's request on the call's stream, as rmcp's service
    /// does: the connection's side handles it, a `POST` carries the answer.
    fn answer_request(
        &self,
        mut request: JsonRpcRequest<ServerRequest>,
        asked: &mut ServerRequests,
        target: &Target,
        session: &Option<Arc<str>>,
    ) -> BoxFuture<'static, ()> {
        let cancel = CancellationToken::new();
        asked.cancel.insert(request.id.clone(), cancel.clone());
        let mut context = RequestContext::new(request.id.clone(), self.peer.clone());
        context.ct = cancel;
        std::mem::swap(&mut context.meta, request.request.get_meta_mut());
        std::mem::swap(&mut context.extensions, request.request.extensions_mut());
        let (side, poster) = (self.side.clone(), self.poster.clone());
        let (target, session) = (target.clone(), session.clone());
        let open = asked.answering.len();
        Box::pin(async move {
            let id = request.id;
            let answer = if open < MAX_OPEN_REQUESTS {
                side.handle_request(request.request, context).await
            } else {
                Err(rmcp::ErrorData::internal_error(
                    format!("more than {MAX_OPEN_REQUESTS} requests open during one call"),
                    None,
                ))
            };
            let message = match answer {
                Ok(result) => ClientJsonRpcMessage::response(result, id),
                Err(error) => ClientJsonRpcMessage::error(error, Some(id)),
            };
            let mut target = target;
            target
                .headers
                .remove(&HeaderName::from_static("mcp-method"));
            target.headers.remove(&HeaderName::from_static("mcp-name"));
            if let Err(PostError::Failed(err)) = poster.post(target, message, session).await {
                // Transport errors quote the URL, which may carry a secret.
                let error = quiver_model::redact_urls(&err.to_string());
                tracing::debug!(%error, "the answer to a server's request was not delivered");
            }
        })
    }
}

/// The server's requests on one call's stream being answered.
#[derive(Default)]
struct ServerRequests {
    answering: FuturesUnordered<BoxFuture<'static, ()>>,
    cancel: HashMap<RequestId, CancellationToken>,
}

/// `message` as the answer to request `id`, or `message` back.
fn answer_to(
    message: ServerJsonRpcMessage,
    id: &RequestId,
) -> Result<Answer, Box<ServerJsonRpcMessage>> {
    match message {
        ServerJsonRpcMessage::Response(response) if &response.id == id => Ok(Ok(response.result)),
        ServerJsonRpcMessage::Error(error) if error.id.as_ref() == Some(id) => {
            Ok(Err(ServiceError::McpError(error.error)))
        }
        other => Err(Box::new(other)),
    }
}

/// Whether `name` travels in a header as it is (rmcp encodes anything else).
fn plain_header_value(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
}
