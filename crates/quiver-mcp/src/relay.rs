//! What servers send the worker on their own, passed on to whoever it is for.
//!
//! Two kinds of traffic come from a server unasked:
//!
//! - **Changes** (`notifications/{tools,resources,prompts}/list_changed`,
//!   `notifications/resources/updated`): published on the pool's
//!   [`ServerEvent`] channel for the gateway to tell its sessions, after the
//!   pool dropped what it cached.
//! - **Traffic of a call** (`notifications/progress`, `notifications/message`,
//!   and the requests `sampling/createMessage`, `elicitation/create` and
//!   `roots/list`): relayed to the caller of the call it belongs to, through
//!   the [`CallPeer`] that call was attached with.
//!
//! Progress is matched exactly: rmcp gives every request upstream a progress
//! token of its own, which the call binds to its caller's token
//! ([`RelayGuard::bind_progress`]) to be mapped back on the way down. Log messages and server requests carry no such link on a shared
//! connection (stdio has no per-request stream), so they are relayed only
//! while exactly one call is in flight on the server and that call is
//! attached; otherwise a log message stays in the server's log tail and a
//! request is refused with an error that says why. Nothing of one caller's
//! call can reach another caller this way.

// SEP-2577 deprecates sampling and server logging; servers still use both.
#![expect(deprecated)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::future::BoxFuture;
use rmcp::model::{
    ClientCapabilities, CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams,
    ElicitResult, ErrorData, ListRootsResult, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProgressToken, RequestMetaObject, RootsCapabilities,
};

/// The client capabilities the worker declares to servers: sampling,
/// elicitation and roots, which it relays to the caller of the call (or
/// refuses; roots asked outside a call are none: the worker has no roots
/// of its own).
pub fn relayed_capabilities() -> ClientCapabilities {
    let mut capabilities = ClientCapabilities::default();
    capabilities.sampling = Some(Default::default());
    capabilities.elicitation = Some(Default::default());
    capabilities.roots = Some(RootsCapabilities::default());
    capabilities
}

/// Capacity of the pool's event channel; a receiver that falls further
/// behind gets `Lagged` and must assume everything changed.
pub const EVENT_CHANNEL_CAPACITY: usize = 1024;

/// Something a server said changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEventKind {
    /// Its tool list (`notifications/tools/list_changed`).
    ToolsChanged,
    /// Its resource list.
    ResourcesChanged,
    /// Its prompt list.
    PromptsChanged,
    /// One resource's content (`notifications/resources/updated`).
    ResourceUpdated(String),
}

/// A change announced by one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEvent {
    /// The server.
    pub server_id: String,
    /// What changed.
    pub kind: ServerEventKind,
}

/// The caller of one call, for what its server sends about the call while it
/// runs and for the requests it makes of the caller.
pub trait CallPeer: Send + Sync + 'static {
    /// A progress notification (its token is already the caller's).
    fn progress(&self, params: ProgressNotificationParam);
    /// A log message the server sent during the call.
    fn log(&self, params: LoggingMessageNotificationParam);
    /// `sampling/createMessage`, answered by the caller.
    fn create_message(
        &self,
        params: CreateMessageRequestParams,
    ) -> BoxFuture<'static, Result<CreateMessageResult, ErrorData>>;
    /// `elicitation/create`, answered by the caller.
    fn create_elicitation(
        &self,
        params: ElicitRequestParams,
    ) -> BoxFuture<'static, Result<ElicitResult, ErrorData>>;
    /// `roots/list` (with the `_meta` the server sent), answered by the caller.
    fn list_roots(
        &self,
        meta: Option<RequestMetaObject>,
    ) -> BoxFuture<'static, Result<ListRootsResult, ErrorData>>;
}

/// A call's link to its caller: set it on the call to relay the server's
/// traffic about it.
#[derive(Clone)]
pub struct CallAttachment {
    /// Where the traffic goes.
    pub peer: Arc<dyn CallPeer>,
    /// The caller's progress token, if it asked for progress.
    pub progress_token: Option<ProgressToken>,
}

impl std::fmt::Debug for CallAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallAttachment")
            .field("progress_token", &self.progress_token)
            .finish_non_exhaustive()
    }
}

struct InFlight {
    id: u64,
    /// When the call's `tool_timeout_ms` runs out: a request relayed for it
    /// waits for the caller's answer until then at most.
    deadline: Instant,
    attachment: Option<CallAttachment>,
    /// The token the call was sent upstream with.
    upstream_token: Option<ProgressToken>,
}

/// The calls in flight on one server, for routing what it sends about them.
#[derive(Default)]
pub struct Relay {
    calls: Mutex<Vec<InFlight>>,
    next_id: AtomicU64,
    /// Progress that came before its call's token was bound: rmcp picks a
    /// request's token as it sends it, and a quick server reports progress
    /// before the sender learns the token. Kept briefly (at most
    /// [`EARLY_PROGRESS`] of them, [`EARLY_PROGRESS_TTL`] long).
    early: Mutex<std::collections::VecDeque<(Instant, ProgressNotificationParam)>>,
}

/// Progress notifications kept per server until their call is bound.
const EARLY_PROGRESS: usize = 64;

/// How long progress waits for its call to be bound.
const EARLY_PROGRESS_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// A call registered with a [`Relay`]; unregisters it when dropped.
pub struct RelayGuard {
    relay: Arc<Relay>,
    id: u64,
}

impl RelayGuard {
    /// Binds the progress token the call was sent upstream with.
    pub fn bind_progress(&self, upstream: ProgressToken) {
        self.relay.bind(Unbound(self.id), upstream);
    }
}

/// A registered call whose progress token is yet to be bound: by its
/// guard when it is first sent, or anew after `Relay::unbind_progress`.
#[must_use = "bind the call's new token with Relay::bind"]
pub(crate) struct Unbound(u64);

impl Drop for RelayGuard {
    fn drop(&mut self) {
        self.relay.lock().retain(|call| call.id != self.id);
    }
}

/// Why a server request could not be relayed.
fn unroutable(what: &str, calls: usize) -> ErrorData {
    let reason = if calls == 0 {
        "no call is in flight".to_owned()
    } else if calls > 1 {
        format!(
            "{calls} calls are in flight on this shared connection, so the caller is ambiguous (isolation = \"per_session\" gives each session its own)"
        )
    } else {
        "the call in flight has no MCP client that could answer it".to_owned()
    };
    ErrorData::invalid_request(format!("quiver cannot relay {what}: {reason}"), None)
}

impl Relay {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<InFlight>> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a call (attached or not: unattached calls make the caller
    /// of unlinked traffic ambiguous too).
    pub fn register(
        self: &Arc<Self>,
        attachment: Option<CallAttachment>,
        deadline: Instant,
    ) -> RelayGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().push(InFlight {
            id,
            deadline,
            attachment,
            upstream_token: None,
        });
        RelayGuard {
            relay: self.clone(),
            id,
        }
    }

    /// Binds `upstream` to `call`, and relays what the server reported with
    /// it before, in order.
    pub(crate) fn bind(&self, call: Unbound, upstream: ProgressToken) {
        if let Some(call) = self.lock().iter_mut().find(|c| c.id == call.0) {
            call.upstream_token = Some(upstream.clone());
        }
        let early: Vec<ProgressNotificationParam> = {
            let mut early = self.early();
            let (mine, others) = early
                .drain(..)
                .partition::<Vec<_>, _>(|(_, params)| params.progress_token == upstream);
            early.extend(others);
            mine.into_iter().map(|(_, params)| params).collect()
        };
        for params in early {
            self.progress(params);
        }
    }

    /// Takes `token` back from the call it is bound to, which is about to be
    /// sent again under a token not known until it is sent (rmcp picks it):
    /// progress meanwhile is kept as before a first binding.
    pub(crate) fn unbind_progress(&self, token: &ProgressToken) -> Option<Unbound> {
        let mut calls = self.lock();
        let call = calls
            .iter_mut()
            .find(|call| call.upstream_token.as_ref() == Some(token))?;
        call.upstream_token = None;
        Some(Unbound(call.id))
    }

    /// The one call in flight (its caller and deadline), when there is
    /// exactly one and it is attached.
    fn sole_attached(&self) -> Result<(Arc<dyn CallPeer>, Instant), usize> {
        let calls = self.lock();
        match calls.as_slice() {
            [only] => only
                .attachment
                .as_ref()
                .map(|a| (a.peer.clone(), only.deadline))
                .ok_or(1),
            more => Err(more.len()),
        }
    }

    /// Relays a request to the sole call's caller, waiting for the answer
    /// until the call's deadline at most.
    async fn request<T>(
        &self,
        what: &str,
        send: impl FnOnce(&dyn CallPeer) -> BoxFuture<'static, Result<T, ErrorData>>,
    ) -> Result<T, ErrorData> {
        let (peer, deadline) = self
            .sole_attached()
            .map_err(|calls| unroutable(what, calls))?;
        tokio::time::timeout_at(deadline.into(), send(peer.as_ref()))
            .await
            .unwrap_or_else(|_| {
                Err(ErrorData::internal_error(
                    format!("the client did not answer {what} within the call's tool_timeout_ms"),
                    None,
                ))
            })
    }

    fn early(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(Instant, ProgressNotificationParam)>>
    {
        self.early.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Relays a progress notification to the call whose token it carries;
    /// returns whether one did. Progress of a call in flight whose token is
    /// not bound yet is kept for it ([`RelayGuard::bind_progress`]).
    pub fn progress(&self, params: ProgressNotificationParam) -> bool {
        if self.relay_progress(params.clone()) {
            return true;
        }
        let unbound = self
            .lock()
            .iter()
            .any(|call| call.attachment.is_some() && call.upstream_token.is_none());
        if unbound {
            let mut early = self.early();
            let now = Instant::now();
            early.retain(|(at, _)| now.duration_since(*at) < EARLY_PROGRESS_TTL);
            if early.len() < EARLY_PROGRESS {
                early.push_back((now, params));
            }
        }
        false
    }

    fn relay_progress(&self, mut params: ProgressNotificationParam) -> bool {
        let target = self.lock().iter().find_map(|call| {
            let attachment = call.attachment.as_ref()?;
            (call.upstream_token.as_ref() == Some(&params.progress_token))
                .then(|| (attachment.peer.clone(), attachment.progress_token.clone()))
        });
        match target {
            Some((peer, Some(token))) => {
                params.progress_token = token;
                peer.progress(params);
                true
            }
            _ => false,
        }
    }

    /// Relays a log message to the sole call in flight, if it is attached.
    pub fn log(&self, params: &LoggingMessageNotificationParam) {
        if let Ok((peer, _)) = self.sole_attached() {
            peer.log(params.clone());
        }
    }

    /// Relays `sampling/createMessage` to the sole call's caller.
    pub async fn create_message(
        &self,
        params: CreateMessageRequestParams,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.request("sampling/createMessage", |peer| peer.create_message(params))
            .await
    }

    /// Relays `elicitation/create` to the sole call's caller.
    pub async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
    ) -> Result<ElicitResult, ErrorData> {
        self.request("elicitation/create", |peer| peer.create_elicitation(params))
            .await
    }

    /// Relays `roots/list` to the sole call's caller; with no call in
    /// flight the answer is no roots (servers ask right after connecting,
    /// and the worker has none of its own).
    pub async fn list_roots(
        &self,
        meta: Option<RequestMetaObject>,
    ) -> Result<ListRootsResult, ErrorData> {
        if self.lock().is_empty() {
            return Ok(ListRootsResult::default());
        }
        self.request("roots/list", |peer| peer.list_roots(meta))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::FutureExt;
    use rmcp::model::{LoggingLevel, NumberOrString};

    use super::*;

    /// Records what it is sent; answers sampling with an error naming itself.
    #[derive(Default)]
    struct Recorder {
        name: &'static str,
        progress: Mutex<Vec<ProgressNotificationParam>>,
        logs: Mutex<usize>,
    }

    impl CallPeer for Recorder {
        fn progress(&self, params: ProgressNotificationParam) {
            self.progress.lock().unwrap().push(params);
        }
        fn log(&self, _params: LoggingMessageNotificationParam) {
            *self.logs.lock().unwrap() += 1;
        }
        fn create_message(
            &self,
            _params: CreateMessageRequestParams,
        ) -> BoxFuture<'static, Result<CreateMessageResult, ErrorData>> {
            let name = self.name;
            async move { Err(ErrorData::internal_error(name, None)) }.boxed()
        }
        fn create_elicitation(
            &self,
            _params: ElicitRequestParams,
        ) -> BoxFuture<'static, Result<ElicitResult, ErrorData>> {
            let name = self.name;
            async move { Err(ErrorData::internal_error(name, None)) }.boxed()
        }
        fn list_roots(
            &self,
            _meta: Option<RequestMetaObject>,
        ) -> BoxFuture<'static, Result<ListRootsResult, ErrorData>> {
            let name = self.name;
            async move { Err(ErrorData::internal_error(name, None)) }.boxed()
        }
    }

    fn token(text: &str) -> ProgressToken {
        ProgressToken(NumberOrString::String(text.to_owned().into()))
    }

    fn attached(peer: &Arc<Recorder>, progress: Option<&str>) -> Option<CallAttachment> {
        Some(CallAttachment {
            peer: peer.clone(),
            progress_token: progress.map(token),
        })
    }

    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    fn sampling() -> CreateMessageRequestParams {
        serde_json::from_value(serde_json::json!({"messages": [], "maxTokens": 1})).unwrap()
    }

    fn log() -> LoggingMessageNotificationParam {
        LoggingMessageNotificationParam::new(LoggingLevel::Info, serde_json::json!("x"))
    }

    #[tokio::test]
    async fn progress_sent_before_its_token_is_bound_reaches_the_call_in_order() {
        let relay = Arc::new(Relay::default());
        let a = Arc::new(Recorder {
            name: "a",
            ..Default::default()
        });
        let call = relay.register(attached(&a, Some("client-a")), far());
        // A quick server: progress before the sender learned the token.
        for step in [1.0, 2.0] {
            assert!(!relay.progress(ProgressNotificationParam::new(token("up-1"), step)));
        }
        assert!(!relay.progress(ProgressNotificationParam::new(token("up-other"), 1.0)));
        call.bind_progress(token("up-1"));
        assert!(relay.progress(ProgressNotificationParam::new(token("up-1"), 3.0)));
        let got: Vec<f64> = a
            .progress
            .lock()
            .unwrap()
            .iter()
            .map(|p| p.progress)
            .collect();
        assert_eq!(got, [1.0, 2.0, 3.0]);
        assert!(
            a.progress
                .lock()
                .unwrap()
                .iter()
                .all(|p| p.progress_token == token("client-a"))
        );
    }

    #[tokio::test]
    async fn progress_goes_to_the_call_of_its_token_under_the_callers_token() {
        let relay = Arc::new(Relay::default());
        let (a, b) = (
            Arc::new(Recorder {
                name: "a",
                ..Default::default()
            }),
            Arc::new(Recorder {
                name: "b",
                ..Default::default()
            }),
        );
        let call_a = relay.register(attached(&a, Some("client-a")), far());
        let call_b = relay.register(attached(&b, Some("client-b")), far());
        call_a.bind_progress(token("up-1"));
        call_b.bind_progress(token("up-2"));
        assert!(relay.progress(ProgressNotificationParam::new(token("up-2"), 1.0)));
        assert!(!relay.progress(ProgressNotificationParam::new(token("up-9"), 1.0)));
        assert!(a.progress.lock().unwrap().is_empty());
        assert_eq!(
            b.progress.lock().unwrap()[0].progress_token,
            token("client-b")
        );
        drop(call_b);
        assert!(!relay.progress(ProgressNotificationParam::new(token("up-2"), 2.0)));
    }

    #[tokio::test]
    async fn unlinked_traffic_goes_only_to_a_sole_attached_call() {
        let relay = Arc::new(Relay::default());
        let a = Arc::new(Recorder {
            name: "a",
            ..Default::default()
        });
        // No call: refused, and the error says why.
        let err = relay.create_message(sampling()).await.unwrap_err();
        assert!(err.message.contains("no call is in flight"), "{err:?}");
        let only = relay.register(attached(&a, None), far());
        relay.log(&log());
        assert_eq!(*a.logs.lock().unwrap(), 1);
        let err = relay.create_message(sampling()).await.unwrap_err();
        assert_eq!(err.message, "a", "relayed to the sole call's caller");
        // Another call in flight (even one without a client): ambiguous.
        let other = relay.register(None, far());
        relay.log(&log());
        assert_eq!(*a.logs.lock().unwrap(), 1, "not relayed while ambiguous");
        let err = relay.create_message(sampling()).await.unwrap_err();
        assert!(err.message.contains("2 calls are in flight"), "{err:?}");
        drop((only, other));
    }
}
