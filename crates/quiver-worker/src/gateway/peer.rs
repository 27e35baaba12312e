//! The gateway's client as the caller of a relayed call: what the server
//! sends about the call goes to the client's session (see
//! `quiver_mcp::relay`), its requests on the stream of the client's request.

// SEP-2577 deprecates sampling and server logging; servers still use both.
#![expect(deprecated)]

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use quiver_mcp::relay::CallPeer;
use rmcp::RoleServer;
use rmcp::model::{
    ClientResult, CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequest, ElicitRequestParams, ElicitResult, ErrorData, GetExtensions,
    LoggingMessageNotificationParam, ProgressNotificationParam, RequestId, ServerRequest,
};
use rmcp::service::{OriginatingRequestId, Peer, ServiceError};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

use crate::gateway::sessions::LiveSession;

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

/// The client of one gateway request.
///
/// Notifications about the call are sent by one task in the order the
/// server sent them, and [`flush`](Self::flush) lets the call's result wait
/// for them: a client counting progress notifications sees every one before
/// the result (a task per notification let the result overtake them).
pub struct DownstreamPeer {
    /// The client's session (its peer and log level).
    session: Arc<LiveSession>,
    /// The client's request the relayed traffic belongs to.
    request_id: RequestId,
    queue: mpsc::UnboundedSender<Relayed>,
}

fn service_error(err: ServiceError) -> ErrorData {
    match err {
        ServiceError::McpError(error) => error,
        other => ErrorData::internal_error(format!("the client did not answer: {other}"), None),
    }
}

impl DownstreamPeer {
    /// The client of `request_id` in `session`; starts the task that sends
    /// its notifications (it ends when the peer is dropped).
    pub fn new(session: Arc<LiveSession>, request_id: RequestId) -> Self {
        let (queue, mut relayed) = mpsc::unbounded_channel();
        let peer: Peer<RoleServer> = session.peer.clone();
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
        DownstreamPeer {
            session,
            request_id,
            queue,
        }
    }

    /// Waits (at most [`FLUSH_WAIT`]) until the notifications relayed so
    /// far are on the client's stream.
    pub async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        if self.queue.send(Relayed::Flushed(done)).is_ok() {
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
        let peer: Peer<RoleServer> = self.session.peer.clone();
        async move { peer.send_request(request).await.map_err(service_error) }.boxed()
    }

    /// Queues a notification for the client if the session has a relay
    /// slot free; otherwise drops it (counted).
    fn notify(&self, relayed: impl FnOnce(OwnedSemaphorePermit) -> Relayed) {
        let Ok(slot) = self.session.relay_slots.clone().try_acquire_owned() else {
            metrics::counter!("mcp_gateway_relay_dropped_total").increment(1);
            return;
        };
        let _ = self.queue.send(relayed(slot));
    }
}

impl CallPeer for DownstreamPeer {
    fn progress(&self, params: ProgressNotificationParam) {
        self.notify(|slot| Relayed::Progress(params, slot));
    }

    fn log(&self, params: LoggingMessageNotificationParam) {
        let wanted = *self
            .session
            .log_level
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if wanted.is_some_and(|level| (params.level as u8) < level as u8) {
            return;
        }
        self.notify(|slot| Relayed::Log(params, slot));
    }

    fn create_message(
        &self,
        params: CreateMessageRequestParams,
    ) -> BoxFuture<'static, Result<CreateMessageResult, ErrorData>> {
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
}
