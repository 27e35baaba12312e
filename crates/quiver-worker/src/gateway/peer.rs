//! The gateway's client as the caller of a relayed call: what the server
//! sends about the call goes to the client (see `quiver_mcp::relay`) on the
//! stream of the client's request: its session's (2025-11-25 and older) or
//! the request's own (2026-07-28, no session) — rmcp's, or the lean edge's
//! ([`relay_channel`], read by `crate::http::mcp`).

// SEP-2577 deprecates sampling and server logging; servers still use both.
#![expect(deprecated)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use quiver_mcp::relay::CallPeer;
use rmcp::RoleServer;
use rmcp::model::{
    ClientResult, CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequest, ElicitRequestParams, ElicitResult, ErrorData, GetExtensions, ListRootsRequest,
    ListRootsResult, LoggingLevel, LoggingMessageNotificationParam, Notification,
    ProgressNotificationParam, RequestId, RequestMetaObject, ServerNotification, ServerRequest,
};
use rmcp::service::{OriginatingRequestId, Peer, ServiceError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::gateway::inputs::Inputs;
use crate::gateway::sessions::{LiveSession, RELAY_SLOTS};

/// Longest wait, when a call is done, for the notifications relayed about
/// it to be handed to the client's stream before its result.
const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// A notification relayed to the client, holding its relay slot.
enum Relayed {
    Progress(ProgressNotificationParam, OwnedSemaphorePermit),
    Log(LoggingMessageNotificationParam, OwnedSemaphorePermit),
    /// Everything queued before it has been handed to the session.
    Flushed(oneshot::Sender<()>),
}

/// The stream notifications about a call reach the client on.
#[derive(Clone)]
pub enum ClientStream {
    /// rmcp's: a session's, or that of a request rmcp serves.
    Peer(Peer<RoleServer>),
    /// The lean edge's, read through its [`RelayReceiver`].
    Relay(RelaySender),
}

/// Where the lean edge's request sends what is relayed about it; nowhere
/// for a request that opted in to nothing relayed ([`RelaySender::none`]).
#[derive(Clone)]
pub struct RelaySender(Option<mpsc::UnboundedSender<Relayed>>);

impl RelaySender {
    /// The stream of a request that opted in to neither progress (no
    /// progress token) nor log messages (no log level): nothing can be
    /// relayed about it, so no channel is made for it.
    pub fn none() -> Self {
        RelaySender(None)
    }
}

/// What the lean edge reads of a request's relayed notifications, in the
/// order the server sent them.
pub struct RelayReceiver(mpsc::UnboundedReceiver<Relayed>);

/// A stream for one request the lean edge answers.
pub fn relay_channel() -> (RelaySender, RelayReceiver) {
    let (sender, receiver) = mpsc::unbounded_channel();
    (RelaySender(Some(sender)), RelayReceiver(receiver))
}

impl Relayed {
    /// The notification, or `None` for a flush marker (answered: what came
    /// before it has been read).
    fn into_notification(self) -> Option<ServerNotification> {
        match self {
            Relayed::Progress(params, _slot) => Some(ServerNotification::ProgressNotification(
                Notification::new(params),
            )),
            Relayed::Log(params, _slot) => Some(ServerNotification::LoggingMessageNotification(
                Notification::new(params),
            )),
            Relayed::Flushed(done) => {
                let _ = done.send(());
                None
            }
        }
    }
}

impl RelayReceiver {
    /// The next notification; `None` once every sender is gone.
    pub async fn next(&mut self) -> Option<ServerNotification> {
        loop {
            if let Some(notification) = self.0.recv().await?.into_notification() {
                return Some(notification);
            }
        }
    }

    /// The next notification already queued, without waiting.
    pub fn try_next(&mut self) -> Option<ServerNotification> {
        loop {
            if let Some(notification) = self.0.try_recv().ok()?.into_notification() {
                return Some(notification);
            }
        }
    }
}

/// Where a call's relayed traffic goes.
pub struct Downstream {
    /// The client's stream.
    pub stream: ClientStream,
    /// The lowest level of log messages relayed (`None`: none are).
    pub log_level: Option<LoggingLevel>,
    /// Relayed notifications in flight at most (shared by a session's calls).
    pub relay_slots: Arc<Semaphore>,
    /// How the server's requests (sampling, elicitation, roots) reach the
    /// client.
    pub asks: Asks,
}

/// How a server's requests reach the client.
#[derive(Clone)]
pub enum Asks {
    /// As requests of their own on the session (2025-11-25 and older).
    Session,
    /// As the `input_required` result of the client's request (2026-07-28:
    /// no server-to-client requests).
    InputRequired(Arc<Inputs>),
}

impl Downstream {
    /// The client of an open session, at the session's log level.
    pub fn of_session(session: &LiveSession) -> Self {
        Downstream {
            stream: ClientStream::Peer(session.peer.clone()),
            // All until the session sets a level.
            log_level: Some(
                session
                    .log_level
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .unwrap_or(LoggingLevel::Debug),
            ),
            relay_slots: session.relay_slots.clone(),
            asks: Asks::Session,
        }
    }

    /// The client of one request without a session (2026-07-28): its
    /// notifications go on the request's own response stream, what the
    /// server asks into `inputs`; log messages only at or above the level
    /// the request's `_meta` opts in to (none without one).
    pub fn of_request(
        stream: ClientStream,
        inputs: Arc<Inputs>,
        log_level: Option<LoggingLevel>,
    ) -> Self {
        Downstream {
            stream,
            log_level,
            relay_slots: Arc::new(Semaphore::new(RELAY_SLOTS)),
            asks: Asks::InputRequired(inputs),
        }
    }
}

/// The client of one gateway request.
///
/// Notifications about the call are sent by one task in the order the
/// server sent them, and [`flush`](Self::flush) lets the call's result wait
/// for them: a client counting progress notifications sees every one before
/// the result (a task per notification let the result overtake them).
pub struct DownstreamPeer {
    /// Where the traffic goes.
    downstream: Downstream,
    /// The client's request the relayed traffic belongs to.
    request_id: RequestId,
    /// To the task that sends the notifications to rmcp's stream, or the
    /// lean edge's stream itself (none: see [`RelaySender::none`]).
    queue: Option<mpsc::UnboundedSender<Relayed>>,
    /// Whether a notification was queued (a flush waits for nothing
    /// otherwise).
    queued: AtomicBool,
}

fn service_error(err: ServiceError) -> ErrorData {
    match err {
        ServiceError::McpError(error) => error,
        other => ErrorData::internal_error(format!("the client did not answer: {other}"), None),
    }
}

impl DownstreamPeer {
    /// The client of `request_id`; on rmcp's stream, starts the task that
    /// sends its notifications (it ends when the peer is dropped).
    pub fn new(downstream: Downstream, request_id: RequestId) -> Self {
        let queue = match &downstream.stream {
            ClientStream::Peer(peer) => Some(Self::sender(peer.clone())),
            ClientStream::Relay(relay) => relay.0.clone(),
        };
        DownstreamPeer {
            downstream,
            request_id,
            queue,
            queued: AtomicBool::new(false),
        }
    }

    /// The task that sends notifications to `peer` in order.
    fn sender(peer: Peer<RoleServer>) -> mpsc::UnboundedSender<Relayed> {
        let (queue, mut relayed) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(item) = relayed.recv().await {
                // A client that went away only fails its own sends.
                match item {
                    Relayed::Progress(params, _slot) => {
                        let _ = peer.notify_progress(params).await;
                    }
                    Relayed::Log(params, _slot) => {
                        let _ = peer.notify_logging_message(params).await;
                    }
                    Relayed::Flushed(done) => {
                        let _ = done.send(());
                    }
                }
            }
        });
        queue
    }

    /// Waits (at most `FLUSH_WAIT`) until the notifications relayed so
    /// far are on the client's stream. Nothing to wait for when none was
    /// queued, or when the queue is the lean edge's own stream: it reads
    /// what came before the result first.
    pub async fn flush(&self) {
        if !self.queued.load(Ordering::Acquire)
            || matches!(self.downstream.stream, ClientStream::Relay(_))
        {
            return;
        }
        let Some(queue) = &self.queue else {
            return;
        };
        let (done, flushed) = oneshot::channel();
        if queue.send(Relayed::Flushed(done)).is_ok() {
            let _ = tokio::time::timeout(FLUSH_WAIT, flushed).await;
        }
    }

    /// Sends a request to the client on the stream of its own request
    /// (SEP-2260 association, which the transport honours).
    fn request(
        &self,
        mut request: ServerRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        request
            .extensions_mut()
            .insert(OriginatingRequestId(self.request_id.clone()));
        let ClientStream::Peer(peer) = self.downstream.stream.clone() else {
            return futures::future::ready(Err(ErrorData::internal_error(
                "the request has no stream to ask its client on",
                None,
            )))
            .boxed();
        };
        async move { peer.send_request(request).await.map_err(service_error) }.boxed()
    }

    /// Queues a notification for the client if the session has a relay
    /// slot free; otherwise drops it (counted).
    fn notify(&self, relayed: impl FnOnce(OwnedSemaphorePermit) -> Relayed) {
        let Some(queue) = &self.queue else {
            return;
        };
        let Ok(slot) = self.downstream.relay_slots.clone().try_acquire_owned() else {
            metrics::counter!("mcp_gateway_relay_dropped_total").increment(1);
            return;
        };
        self.queued.store(true, Ordering::Release);
        let _ = queue.send(relayed(slot));
    }
}

impl CallPeer for DownstreamPeer {
    fn progress(&self, params: ProgressNotificationParam) {
        self.notify(|slot| Relayed::Progress(params, slot));
    }

    fn log(&self, params: LoggingMessageNotificationParam) {
        let wanted = self
            .downstream
            .log_level
            .is_some_and(|level| params.level as u8 >= level as u8);
        if !wanted {
            return;
        }
        self.notify(|slot| Relayed::Log(params, slot));
    }

    fn create_message(
        &self,
        params: CreateMessageRequestParams,
    ) -> BoxFuture<'static, Result<CreateMessageResult, ErrorData>> {
        if let Asks::InputRequired(inputs) = &self.downstream.asks {
            let inputs = inputs.clone();
            return async move { inputs.sample(params).await }.boxed();
        }
        let answer = self.request(ServerRequest::CreateMessageRequest(
            CreateMessageRequest::new(params),
        ));
        async move {
            match answer.await? {
                ClientResult::CreateMessageResult(result) => Ok(*result),
                _ => Err(ErrorData::internal_error(
                    "the client answered sampling/createMessage with another result",
                    None,
                )),
            }
        }
        .boxed()
    }

    fn create_elicitation(
        &self,
        params: ElicitRequestParams,
    ) -> BoxFuture<'static, Result<ElicitResult, ErrorData>> {
        if let Asks::InputRequired(inputs) = &self.downstream.asks {
            let inputs = inputs.clone();
            return async move { inputs.elicit(params).await }.boxed();
        }
        let answer = self.request(ServerRequest::ElicitRequest(ElicitRequest::new(params)));
        async move {
            match answer.await? {
                ClientResult::ElicitResult(result) => Ok(result),
                _ => Err(ErrorData::internal_error(
                    "the client answered elicitation/create with another result",
                    None,
                )),
            }
        }
        .boxed()
    }

    fn list_roots(
        &self,
        meta: Option<RequestMetaObject>,
    ) -> BoxFuture<'static, Result<ListRootsResult, ErrorData>> {
        if let Asks::InputRequired(inputs) = &self.downstream.asks {
            let inputs = inputs.clone();
            return async move { inputs.roots(meta).await }.boxed();
        }
        // A client that declared no roots has none to give.
        let declared = match &self.downstream.stream {
            ClientStream::Peer(peer) => peer.peer_info(),
            ClientStream::Relay(_) => None,
        }
        .is_some_and(|info| info.capabilities.roots.is_some());
        if !declared {
            return futures::future::ready(Ok(ListRootsResult::default())).boxed();
        }
        let answer = self.request(ServerRequest::ListRootsRequest(ListRootsRequest::default()));
        async move {
            match answer.await? {
                ClientResult::ListRootsResult(result) => Ok(result),
                _ => Err(ErrorData::internal_error(
                    "the client answered roots/list with another result",
                    None,
                )),
            }
        }
        .boxed()
    }
}
