//! The worker's side of an MCP client connection: who it says it is, and
//! where what the server sends on its own goes (log tail, relays to the
//! caller of a call in flight, change events), for rmcp's service and for
//! [`crate::direct_call`] alike.

use std::sync::Arc;

use rmcp::model::{ClientConfig, Implementation, ServerNotification};
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient};
use tokio::sync::broadcast;

use crate::relay::{Relay, ServerEvent, ServerEventKind};
use crate::server_log::ServerLog;
use crate::tools::ToolsCache;

/// The worker's side of a connection: who it is, and where what the server
/// sends on its own goes (see [`crate::relay`]).
#[derive(Clone)]
pub struct ClientSide {
    /// The server's log tail.
    pub(crate) log: ServerLog,
    /// The calls in flight on the server, for their traffic.
    pub(crate) relay: Arc<Relay>,
    /// Where changes the server announces are published.
    pub(crate) events: broadcast::Sender<ServerEvent>,
    /// Dropped when the server says its tools changed.
    pub(crate) tools: Arc<ToolsCache>,
}

impl ClientSide {
    /// A side for a connection of its own (a probe): its log goes to `log`,
    /// nothing else is relayed or published.
    pub fn standalone(log: ServerLog) -> Self {
        ClientSide {
            log,
            relay: Arc::default(),
            events: broadcast::channel(1).0,
            tools: Arc::default(),
        }
    }

    /// Hands on what the server sent on its own outside rmcp's service (see
    /// [`crate::direct_call`]), as the handlers below do.
    pub(crate) fn notified(&self, notification: ServerNotification) {
        match notification {
            ServerNotification::LoggingMessageNotification(message) => {
                self.logged(&message.params);
            }
            ServerNotification::ProgressNotification(progress) => {
                self.relay.progress(progress.params);
            }
            ServerNotification::ToolListChangedNotification(_) => {
                self.publish(ServerEventKind::ToolsChanged);
            }
            ServerNotification::ResourceListChangedNotification(_) => {
                self.publish(ServerEventKind::ResourcesChanged);
            }
            ServerNotification::PromptListChangedNotification(_) => {
                self.publish(ServerEventKind::PromptsChanged);
            }
            ServerNotification::ResourceUpdatedNotification(updated) => {
                self.publish(ServerEventKind::ResourceUpdated(updated.params.uri));
            }
            // Cancellations are the caller's to read; the rest rmcp's
            // handlers ignore too.
            _ => {}
        }
    }

    #[expect(deprecated, reason = "SEP-2577 deprecates server logging")]
    fn logged(&self, params: &rmcp::model::LoggingMessageNotificationParam) {
        self.log.record(params);
        self.relay.log(params);
    }

    fn publish(&self, kind: ServerEventKind) {
        if let ServerEventKind::ToolsChanged = kind {
            self.tools.clear();
        }
        // Nobody listening (no gateway session) is not an error.
        let _ = self.events.send(ServerEvent {
            server_id: self.log.server_id().to_owned(),
            kind,
        });
    }
}

/// The `_meta` of a server's request as it is relayed: rmcp hands it to the
/// handler apart from the params, and the caller must see it (a server may
/// name its input there, see the gateway's `inputs`); the progress token is
/// the connection's own.
fn request_meta(
    params_meta: Option<rmcp::model::RequestMetaObject>,
    context: &rmcp::service::RequestContext<RoleClient>,
) -> Option<rmcp::model::RequestMetaObject> {
    let mut meta = params_meta.unwrap_or_else(|| context.meta.clone());
    meta.0.0.remove("progressToken");
    (!meta.0.0.is_empty()).then_some(meta)
}

/// A relayed server request, given up when the server cancels it: dropping
/// the request to the client sends the client `notifications/cancelled`.
async fn unless_cancelled<T>(
    context: &rmcp::service::RequestContext<RoleClient>,
    relayed: impl std::future::Future<Output = Result<T, rmcp::ErrorData>>,
) -> Result<T, rmcp::ErrorData> {
    tokio::select! {
        answer = relayed => answer,
        () = context.ct.cancelled() => Err(rmcp::ErrorData::internal_error(
            "cancelled by the server",
            None,
        )),
    }
}

impl ClientHandler for ClientSide {
    fn get_info(&self) -> ClientConfig {
        let capabilities = crate::relay::relayed_capabilities();
        // The version an `initialize` handshake offers: the newest with one
        // (2026-07-28 has none; its connections open with `server/discover`,
        // see `crate::lifecycle`).
        ClientConfig::new(
            capabilities,
            Implementation::new("quiver-worker", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    #[expect(
        deprecated,
        reason = "SEP-2577 deprecates server logging, but servers still send it (and flood with it)"
    )]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.logged(&params);
    }

    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.relay.progress(params);
    }

    #[expect(
        deprecated,
        reason = "SEP-2577 deprecates sampling; servers still use it"
    )]
    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        let mut params = params;
        params.meta = request_meta(params.meta.take(), &context);
        unless_cancelled(&context, self.relay.create_message(params)).await
    }

    async fn create_elicitation(
        &self,
        params: rmcp::model::ElicitRequestParams,
        context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        let mut params = params;
        if let rmcp::model::ElicitRequestParams::FormElicitationParams { meta, .. }
        | rmcp::model::ElicitRequestParams::UrlElicitationParams { meta, .. } = &mut params
        {
            *meta = request_meta(meta.take(), &context);
        }
        unless_cancelled(&context, self.relay.create_elicitation(params)).await
    }

    #[expect(deprecated, reason = "SEP-2577 deprecates roots; servers still ask")]
    async fn list_roots(
        &self,
        context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ListRootsResult, rmcp::ErrorData> {
        unless_cancelled(
            &context,
            self.relay.list_roots(request_meta(None, &context)),
        )
        .await
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.publish(ServerEventKind::ToolsChanged);
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.publish(ServerEventKind::ResourcesChanged);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.publish(ServerEventKind::PromptsChanged);
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.publish(ServerEventKind::ResourceUpdated(params.uri));
    }
}
