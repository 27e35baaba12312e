//! The gateway's open sessions on this worker, and the notifier that tells
//! them when what they may use changes (`notifications/*/list_changed`,
//! `notifications/resources/updated`).
//!
//! Two sources of change: the registry (a new snapshot changes the records
//! of some servers) and the servers themselves (their own list_changed and
//! resource updates, published by the pool, see `quiver_mcp::relay`). A
//! session is told about a server its endpoint covers and its caller's task
//! selects (before or after the change). Notifications are sent from one
//! task per change, never from the paths that serve requests, and a session
//! whose client went away only costs a failed send.

// SEP-2577 deprecates logging; clients still set levels.
#![expect(deprecated)]

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use quiver_mcp::McpPool;
use quiver_mcp::relay::{ServerEvent, ServerEventKind};
use quiver_model::StoredServer;
use quiver_model::policy::server_selected;
use quiver_sync::SnapshotHandle;
use rmcp::RoleServer;
use rmcp::model::{LoggingLevel, ResourceUpdatedNotificationParam};
use rmcp::service::Peer;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::auth::Task;
use crate::gateway::scope::Scope;

/// One open session.
pub struct LiveSession {
    /// The client.
    pub peer: Peer<RoleServer>,
    /// The caller's task when the session was opened.
    pub task: Task,
    /// The endpoint.
    pub scope: Scope,
    /// Resources the client subscribed to (`/mcp/{id}` only).
    pub subscriptions: Mutex<BTreeSet<String>>,
    /// The lowest level of the server's log messages relayed to the client
    /// (`logging/setLevel`; all until set).
    pub log_level: Mutex<Option<LoggingLevel>>,
    /// Relayed notifications on their way to the client at most; beyond,
    /// a server that floods progress or log messages loses them, not memory.
    pub relay_slots: Arc<tokio::sync::Semaphore>,
}

/// Relayed notifications in flight per session at most.
pub const RELAY_SLOTS: usize = 256;

impl LiveSession {
    /// Whether this session may be told about `server`.
    fn concerns(&self, server: Option<&StoredServer>) -> bool {
        server.is_some_and(|server| {
            self.scope.covers(&server.spec.server_id)
                && server_selected(&server.spec, &self.task.policy, None).is_ok()
        })
    }

    /// Whether the client subscribed to `uri`.
    pub fn subscribed(&self, uri: &str) -> bool {
        self.subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(uri)
    }
}

/// The sessions open on this worker.
#[derive(Default)]
pub struct LiveSessions {
    sessions: Mutex<HashMap<u64, Arc<LiveSession>>>,
    next_id: AtomicU64,
}

/// Keeps a session registered; dropped with the session's handler.
pub struct Registered {
    sessions: Arc<LiveSessions>,
    id: u64,
    /// The session.
    pub session: Arc<LiveSession>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut sessions = self.sessions.lock();
        sessions.remove(&self.id);
        metrics::gauge!("mcp_gateway_sessions").set(sessions.len() as f64);
    }
}

impl LiveSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<LiveSession>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a session until the returned guard is dropped.
    pub fn register(self: &Arc<Self>, session: LiveSession) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let session = Arc::new(session);
        let mut sessions = self.lock();
        sessions.insert(id, session.clone());
        metrics::gauge!("mcp_gateway_sessions").set(sessions.len() as f64);
        Registered {
            sessions: self.clone(),
            id,
            session,
        }
    }

    /// How many sessions are open.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every open session.
    pub fn all(&self) -> Vec<Arc<LiveSession>> {
        self.lock().values().cloned().collect()
    }

    /// Whether another session than `except` of `server_id` subscribed to `uri`.
    pub fn subscribed_elsewhere(&self, except: &LiveSession, server_id: &str, uri: &str) -> bool {
        self.all().iter().any(|session| {
            !std::ptr::eq(session.as_ref(), except)
                && session.scope == Scope::Server(server_id.to_owned())
                && session.subscribed(uri)
        })
    }
}

/// Which lists of a session changed.
#[derive(Debug, Clone, Copy, Default)]
struct Changed {
    tools: bool,
    resources: bool,
    prompts: bool,
}

async fn notify(session: &LiveSession, changed: Changed) {
    // A failed send means the client is gone; its session ends on its own.
    if changed.tools {
        let _ = session.peer.notify_tool_list_changed().await;
    }
    if changed.resources {
        let _ = session.peer.notify_resource_list_changed().await;
    }
    if changed.prompts {
        let _ = session.peer.notify_prompt_list_changed().await;
    }
    metrics::counter!("mcp_gateway_notifications_total").increment(1);
}

/// Tells sessions about changes until `shutdown`.
pub async fn follow_changes(
    sessions: Arc<LiveSessions>,
    snapshot: SnapshotHandle,
    pool: McpPool,
    shutdown: CancellationToken,
) {
    let mut updates = snapshot.subscribe();
    let mut seen = updates.borrow_and_update().snapshot.clone();
    let mut events = pool.events();
    let everything = Changed {
        tools: true,
        resources: true,
        prompts: true,
    };
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = updates.changed() => {
                if changed.is_err() {
                    return;
                }
                let update = updates.borrow_and_update().clone();
                let ids = update.changed_since(&seen);
                seen = update.snapshot.clone();
                for session in sessions.all() {
                    let concerned = ids.iter().any(|id| {
                        session.concerns(update.snapshot.get(id).map(AsRef::as_ref))
                            || session.concerns(update.previous.get(id).map(AsRef::as_ref))
                    });
                    if concerned {
                        notify(&session, everything).await;
                    }
                }
            }
            event = events.recv() => {
                let current = snapshot.current();
                match event {
                    Ok(ServerEvent { server_id, kind }) => {
                        let server = current.get(&server_id).map(AsRef::as_ref);
                        for session in sessions.all().iter().filter(|s| s.concerns(server)) {
                            match &kind {
                                ServerEventKind::ToolsChanged => notify(session, Changed { tools: true, ..Default::default() }).await,
                                ServerEventKind::ResourcesChanged => notify(session, Changed { resources: true, ..Default::default() }).await,
                                ServerEventKind::PromptsChanged => notify(session, Changed { prompts: true, ..Default::default() }).await,
                                ServerEventKind::ResourceUpdated(uri) => {
                                    if session.scope == Scope::Server(server_id.clone()) && session.subscribed(uri) {
                                        let _ = session.peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri.clone())).await;
                                    }
                                }
                            }
                        }
                    }
                    // Fell behind a flood of events: assume everything changed.
                    Err(RecvError::Lagged(_)) => {
                        for session in sessions.all() {
                            notify(&session, everything).await;
                        }
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        }
    }
}
