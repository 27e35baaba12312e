//! Server side of MCP's legacy "HTTP+SSE" transport (protocol 2024-11-05), so any
//! `rmcp::ServerHandler` can be served to legacy SSE clients.
//!
//! `GET /sse` opens a session: the response is an event stream whose first event is
//! `endpoint` (data `/message?sessionId=<id>`), followed by one `message` event per
//! server→client JSON-RPC message. `POST /message?sessionId=<id>` delivers one
//! client→server message and is answered `202 Accepted`; responses travel over the
//! stream. rmcp does all JSON-RPC: each session runs `factory().serve(transport)` over a
//! small channel-backed [`rmcp::transport::Transport`]. The session ends when the SSE
//! connection drops, when the service stops, or on shutdown.
//!
//! The endpoint path is absolute, so the router must be served at the root.

use axum::serve::ListenerExt;
use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::{
    Router,
    extract::{Query, State, rejection::QueryRejection},
    http::StatusCode,
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
    routing::{get, post},
};
use bytes::Bytes;
use futures::{StreamExt, stream};
use rmcp::{
    RoleServer, ServerHandler, ServiceExt,
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::Transport,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// Path of the SSE stream that opens a session.
pub const SSE_PATH: &str = "/sse";

/// Path client messages are POSTed to, with `?sessionId=<id>`.
pub const MESSAGE_PATH: &str = "/message";

/// Messages buffered per direction and session before senders wait; bounded so a client
/// that stops reading cannot grow the server's memory.
const CHANNEL_CAPACITY: usize = 64;

/// Keeps idle streams alive through proxies and lets clients notice dead servers.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// A router serving legacy SSE sessions of `factory()` until their clients disconnect.
pub fn router<S, F>(factory: F) -> Router
where
    F: Fn() -> S + Clone + Send + Sync + 'static,
    S: ServerHandler,
{
    router_with_shutdown(factory, CancellationToken::new())
}

/// Like [`router`], but cancelling `shutdown` ends every session and its stream, so a
/// graceful HTTP shutdown is not held up by open event streams.
pub fn router_with_shutdown<S, F>(factory: F, shutdown: CancellationToken) -> Router
where
    F: Fn() -> S + Clone + Send + Sync + 'static,
    S: ServerHandler,
{
    let state = AppState {
        factory,
        sessions: Sessions::default(),
        shutdown,
    };
    Router::new()
        .route(SSE_PATH, get(open_session::<S, F>))
        .route(MESSAGE_PATH, post(post_message::<F>))
        .with_state(state)
}

/// Serves legacy SSE sessions of `factory()` on `listener` until `shutdown` is cancelled.
pub async fn serve<S, F>(
    listener: tokio::net::TcpListener,
    factory: F,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    F: Fn() -> S + Clone + Send + Sync + 'static,
    S: ServerHandler,
{
    let app = router_with_shutdown(factory, shutdown.clone());
    axum::serve(listener.tap_io(crate::http::no_delay), app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

#[derive(Clone)]
struct AppState<F> {
    factory: F,
    sessions: Sessions,
    shutdown: CancellationToken,
}

/// Open sessions by id: where a POST finds the channel into the session's service.
#[derive(Clone, Default)]
struct Sessions(Arc<Mutex<HashMap<String, mpsc::Sender<ClientJsonRpcMessage>>>>);

impl Sessions {
    // A poisoned map is still consistent (every critical section is a single map
    // operation), so poisoning is ignored rather than turned into a panic.
    fn insert(&self, id: String, sender: mpsc::Sender<ClientJsonRpcMessage>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, sender);
    }

    fn get(&self, id: &str) -> Option<mpsc::Sender<ClientJsonRpcMessage>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    fn remove(&self, id: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }
}

/// Lives as long as the session's response stream: dropped when the client disconnects
/// (hyper drops the body) or the stream ends, and then tears the session down.
struct SessionGuard {
    id: String,
    sessions: Sessions,
    cancel: CancellationToken,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.sessions.remove(&self.id);
        self.cancel.cancel();
        tracing::debug!(session = %self.id, "legacy sse session closed");
    }
}

async fn open_session<S, F>(State(state): State<AppState<F>>) -> impl IntoResponse
where
    F: Fn() -> S + Clone + Send + Sync + 'static,
    S: ServerHandler,
{
    let id = format!("{:032x}", rand::random::<u128>());
    let (client_tx, client_rx) = mpsc::channel(CHANNEL_CAPACITY);
    let (server_tx, server_rx) = mpsc::channel(CHANNEL_CAPACITY);
    state.sessions.insert(id.clone(), client_tx);
    let cancel = state.shutdown.child_token();

    let transport = SessionTransport {
        to_client: server_tx,
        from_client: client_rx,
    };
    let service = (state.factory)();
    let service_cancel = cancel.clone();
    let session = id.clone();
    tokio::spawn(async move {
        match service.serve_with_ct(transport, service_cancel).await {
            Ok(running) => {
                let reason = running.waiting().await;
                tracing::debug!(%session, ?reason, "legacy sse service stopped");
            }
            Err(error) => {
                tracing::debug!(%session, %error, "legacy sse session ended before initialization");
            }
        }
    });

    let endpoint = Event::default()
        .event("endpoint")
        .data(format!("{MESSAGE_PATH}?sessionId={id}"));
    let guard = SessionGuard {
        id,
        sessions: state.sessions.clone(),
        cancel: cancel.clone(),
    };
    let messages = ReceiverStream::new(server_rx).filter_map(|message| async move {
        match Event::default().event("message").json_data(&message) {
            Ok(event) => Some(event),
            Err(error) => {
                tracing::warn!(%error, "cannot encode server message, dropping it");
                None
            }
        }
    });
    let events = stream::once(async { endpoint })
        .chain(messages)
        .take_until(cancel.cancelled_owned())
        .map(move |event| {
            // Owning the guard here ties the session's lifetime to the response body.
            let _ = &guard;
            Ok::<_, Infallible>(event)
        });
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE_INTERVAL))
}

#[derive(serde::Deserialize)]
struct SessionQuery {
    #[serde(rename = "sessionId")]
    session_id: String,
}

async fn post_message<F>(
    State(state): State<AppState<F>>,
    query: Result<Query<SessionQuery>, QueryRejection>,
    body: Bytes,
) -> Response
where
    F: Clone + Send + Sync + 'static,
{
    let Ok(Query(SessionQuery { session_id })) = query else {
        return (StatusCode::BAD_REQUEST, "missing sessionId").into_response();
    };
    let Some(sender) = state.sessions.get(&session_id) else {
        return (StatusCode::NOT_FOUND, "unknown session").into_response();
    };
    let message = match serde_json::from_slice::<ClientJsonRpcMessage>(&body) {
        Ok(message) => message,
        Err(error) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("invalid json-rpc message: {error}"),
            )
                .into_response();
        }
    };
    if sender.send(message).await.is_err() {
        return (StatusCode::NOT_FOUND, "session closed").into_response();
    }
    (StatusCode::ACCEPTED, "Accepted").into_response()
}

/// The rmcp side of one session: messages POSTed by the client come in over
/// `from_client`, the service's messages go out to the SSE stream over `to_client`.
struct SessionTransport {
    to_client: mpsc::Sender<ServerJsonRpcMessage>,
    from_client: mpsc::Receiver<ClientJsonRpcMessage>,
}

#[derive(Debug, thiserror::Error)]
#[error("legacy sse session closed")]
struct SessionClosed;

impl Transport<RoleServer> for SessionTransport {
    type Error = SessionClosed;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let to_client = self.to_client.clone();
        async move { to_client.send(item).await.map_err(|_| SessionClosed) }
    }

    // `recv` is cancel-safe, which rmcp's `select!` loop requires.
    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        self.from_client.recv().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.from_client.close();
        Ok(())
    }
}
