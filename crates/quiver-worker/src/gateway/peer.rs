//! The gateway's client as the caller of a relayed call: what the server
//! sends about the call goes to the client's session (see
//! `quiver_mcp::relay`), its requests on the stream of the client's request.

// SEP-2577 deprecates sampling and server logging; servers still use both.
#![expect(deprecated)]

use std::sync::Arc;

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

use crate::gateway::sessions::LiveSession;

/// The client of one gateway request.
pub struct DownstreamPeer {
    /// The client's session (its peer and log level).
    pub session: Arc<LiveSession>,
    /// The client's request the relayed traffic belongs to.
    pub request_id: RequestId,
}

fn service_error(err: ServiceError) -> ErrorData {
    match err {
        ServiceError::McpError(error) => error,
        other => ErrorData::internal_error(format!("the client did not answer: {other}"), None),
    }
}

impl DownstreamPeer {
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

    /// Sends a notification to the client in a task of its own, if the
    /// session has a relay slot free; otherwise drops it (counted).
    fn notify<F>(&self, send: impl FnOnce(Peer<RoleServer>) -> F)
    where
        F: Future<Output = Result<(), ServiceError>> + Send + 'static,
    {
        let Ok(slot) = self.session.relay_slots.clone().try_acquire_owned() else {
            metrics::counter!("mcp_gateway_relay_dropped_total").increment(1);
            return;
        };
        let sending = send(self.session.peer.clone());
        tokio::spawn(async move {
            // A client that went away only fails this send.
            let _ = sending.await;
            drop(slot);
        });
    }
}

impl CallPeer for DownstreamPeer {
    fn progress(&self, params: ProgressNotificationParam) {
        self.notify(|peer| async move { peer.notify_progress(params).await });
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
        self.notify(|peer| async move { peer.notify_logging_message(params).await });
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
