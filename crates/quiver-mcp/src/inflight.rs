//! A `tools/call` on the wire, holding its call slot until the server is
//! done with it.
//!
//! `max_concurrency` bounds what a server works on at once, not only what
//! callers wait for. A call that runs out of `tool_timeout_ms` (or whose
//! caller goes away) is answered `mcp_timeout` at once and cancelled on the
//! server (`notifications/cancelled`), but its slot stays taken until the
//! server answers it or `cancel_grace` after the cancellation has passed.
//! If the grace passes unanswered, the connection is recycled: a stdio
//! server's processes are ended, an HTTP session is dropped (which ends the
//! work only if the server stops a session's calls with it), and the other
//! calls in flight on it fail with `mcp_unavailable` naming the reason; the
//! next call connects anew.
//!
//! The trade-off: MCP asks servers not to answer a request they were told
//! to cancel, so a server that stopped at once cannot be told apart from one
//! that is still at work. A timed-out call therefore costs its slot for up to
//! `cancel_grace`, and, unless the server answers it anyway (many do, with a
//! result or an error), the connection: calls of other sessions in flight on
//! it fail, and a stdio server pays a restart. In exchange no server ever
//! works on more than `max_concurrency` calls of one connection, however
//! its calls time out.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientNotification, ClientRequest, CustomNotification,
    ProgressToken, RequestId, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RequestHandle, ServiceError};
use tokio::sync::oneshot;

use crate::connection::Connection;

/// What the server answered to one call.
pub type Answer = Result<ServerResult, ServiceError>;

/// Where a call's answer comes from: rmcp's service, or the calling task's
/// own `POST` ([`crate::direct_call`]).
enum Pending {
    Rmcp(oneshot::Receiver<Answer>),
    Direct(BoxFuture<'static, Answer>),
}

impl Pending {
    async fn answer(&mut self) -> Answer {
        match self {
            // The sender goes away unanswered only when the connection closes.
            Pending::Rmcp(receiver) => receiver.await.unwrap_or(Err(ServiceError::TransportClosed)),
            Pending::Direct(answer) => answer.await,
        }
    }
}

/// A call sent to a server; dropping it unanswered abandons the call (see
/// the module documentation) and keeps `slot` until the server is done.
pub struct InFlightCall<S: Send + 'static> {
    connection: Arc<Connection>,
    id: RequestId,
    /// The progress token the call was sent with.
    pub progress_token: ProgressToken,
    answer: Option<Pending>,
    slot: Option<S>,
    cancel_grace: Duration,
}

impl<S: Send + 'static> InFlightCall<S> {
    /// Sends `tools/call` on `connection`, holding `slot` (the call's
    /// permits) until the server is done with it; `meta` wins over the
    /// `_meta` rmcp stamps on a 2026-07-28 request (the caller's own
    /// capabilities, for one).
    pub async fn send(
        connection: Arc<Connection>,
        params: CallToolRequestParams,
        slot: S,
        cancel_grace: Duration,
        meta: Option<rmcp::model::RequestMetaObject>,
    ) -> Result<Self, ServiceError> {
        if let Some(direct) = connection.direct()
            && let Some(posting) = direct.posting(&params.name)
        {
            let sent = direct.send(posting, params, meta);
            return Ok(InFlightCall {
                connection,
                id: sent.id,
                progress_token: sent.progress_token,
                answer: Some(Pending::Direct(sent.answer)),
                slot: Some(slot),
                cancel_grace,
            });
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        // No rmcp timeout: it would forget the request when it cancels it,
        // and a late answer is what tells that the server is done.
        let RequestHandle {
            rx,
            id,
            progress_token,
            ..
        } = connection
            .peer()
            .send_cancellable_request(
                request,
                match meta {
                    Some(meta) => PeerRequestOptions::no_options().with_meta(meta),
                    None => PeerRequestOptions::no_options(),
                },
            )
            .await?;
        Ok(InFlightCall {
            connection,
            id,
            progress_token,
            answer: Some(Pending::Rmcp(rx)),
            slot: Some(slot),
            cancel_grace,
        })
    }

    /// The server's answer, if it comes within `within`; otherwise the call
    /// is abandoned and `None` returned.
    pub async fn answer(mut self, within: Duration) -> Option<Answer> {
        let pending = self.answer.as_mut()?;
        let answered = tokio::time::timeout(within, pending.answer()).await.ok()?;
        self.answer = None;
        Some(answered)
    }
}

impl<S: Send + 'static> Drop for InFlightCall<S> {
    fn drop(&mut self) {
        let (Some(answer), Some(slot)) = (self.answer.take(), self.slot.take()) else {
            return;
        };
        // Without a runtime (process exit) there is no server left to wait for.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(abandon(
                self.connection.clone(),
                self.id.clone(),
                answer,
                slot,
                self.cancel_grace,
            ));
        }
    }
}

/// Cancels the call on the server and holds `slot` until the server answers
/// or `grace` passes; then recycles the connection.
async fn abandon<S>(
    connection: Arc<Connection>,
    id: RequestId,
    mut answer: Pending,
    slot: S,
    grace: Duration,
) {
    // Sent as a plain notification: rmcp's own cancellation would drop the
    // pending request, and with it the answer this waits for.
    let cancelled = CustomNotification::new(
        "notifications/cancelled",
        Some(serde_json::json!({
            "requestId": id.clone().into_json_value(),
            "reason": "tool_timeout_ms exceeded or caller gone",
        })),
    );
    let _ = tokio::time::timeout(
        grace,
        connection
            .peer()
            .send_notification(ClientNotification::CustomNotification(cancelled)),
    )
    .await;
    if tokio::time::timeout(grace, answer.answer()).await.is_err() {
        let reason = format!(
            "a cancelled call was not answered within cancel_grace ({} ms)",
            grace.as_millis()
        );
        connection.recycle("cancel_unanswered", reason).await;
    }
    drop(slot);
}
