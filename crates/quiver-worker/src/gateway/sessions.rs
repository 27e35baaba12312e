//! The gateway's open sessions on this worker, and the notifier that tells
//! them when what they may use changes (`notifications/*/list_changed`,
//! `notifications/resources/updated`).
//!
//! Two sources of change: the registry (a new snapshot changes the records
//! of some servers, or the policy a session's caller has) and the servers themselves (their own list_changed and
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
use rmcp::service::{Peer, SubscriptionSink};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::auth::Task;
use crate::gateway::scope::Scope;
use crate::registry_callers::changed_policies;

/// The caller a request is for, as the edge attached it to the request
/// (the digest sessions are bound to and counted by per caller).
#[derive(Debug, Clone)]
pub struct SessionCaller(pub String);

/// The caller the edge attached to a request (empty when none was).
pub fn caller_of(context: &rmcp::service::RequestContext<RoleServer>) -> String {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<SessionCaller>())
        .map(|caller| caller.0.clone())
        .unwrap_or_default()
}

/// One open session, or one `subscriptions/listen` stream of a 2026-07-28
/// client (told about changes the same way, on its stream).
pub struct LiveSession {
    /// The client.
    pub peer: Peer<RoleServer>,
    /// The listen stream the changes go to, when this is one.
    pub listen: Option<SubscriptionSink>,
    /// Who opened it ([`SessionCaller`]).
    pub caller: String,
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
    state: Mutex<State>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct State {
    sessions: HashMap<u64, Arc<LiveSession>>,
    /// Open sessions plus admissions, per caller.
    held: HashMap<String, usize>,
    /// Admissions not (yet) registered as sessions.
    pending: usize,
}

impl State {
    fn release(&mut self, caller: &str) {
        if let Some(held) = self.held.get_mut(caller) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                self.held.remove(caller);
            }
        }
    }
}

/// Why a session was not admitted: the cap reached, with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// `max_sessions`: sessions open on this worker.
    Sessions(usize),
    /// `max_sessions_per_caller`: sessions one caller has open here.
    Caller(usize),
}

/// A session slot taken for a request that opens a session (`initialize`)
/// or restores one this worker does not hold; released when the request
/// is done (the session, if one opened, then counts by itself).
pub struct Admission {
    sessions: Arc<LiveSessions>,
    caller: String,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut state = self.sessions.lock();
        state.pending = state.pending.saturating_sub(1);
        state.release(&self.caller);
    }
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
        let mut state = self.sessions.lock();
        if state.sessions.remove(&self.id).is_some() {
            state.release(&self.session.caller);
        }
        metrics::gauge!("mcp_gateway_sessions").set(state.sessions.len() as f64);
    }
}

impl LiveSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for a session of `caller`, unless this worker holds
    /// `max_sessions` sessions (open or being opened) or `caller` holds
    /// `max_per_caller` of them. Checked and taken under one lock, so
    /// concurrent requests never overshoot a cap.
    pub fn admit(
        self: &Arc<Self>,
        caller: &str,
        max_sessions: usize,
        max_per_caller: usize,
    ) -> Result<Admission, Full> {
        let mut state = self.lock();
        if state.sessions.len() + state.pending >= max_sessions {
            return Err(Full::Sessions(max_sessions));
        }
        let held = state.held.get(caller).copied().unwrap_or(0);
        if held >= max_per_caller {
            return Err(Full::Caller(max_per_caller));
        }
        state.pending += 1;
        *state.held.entry(caller.to_owned()).or_default() += 1;
        Ok(Admission {
            sessions: self.clone(),
            caller: caller.to_owned(),
        })
    }

    /// Registers a session until the returned guard is dropped.
    pub fn register(self: &Arc<Self>, session: LiveSession) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let session = Arc::new(session);
        let mut state = self.lock();
        state.sessions.insert(id, session.clone());
        *state.held.entry(session.caller.clone()).or_default() += 1;
        metrics::gauge!("mcp_gateway_sessions").set(state.sessions.len() as f64);
        Registered {
            sessions: self.clone(),
            id,
            session,
        }
    }

    /// How many sessions are open.
    pub fn len(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many sessions `caller` has open (or being opened).
    pub fn held_by(&self, caller: &str) -> usize {
        self.lock().held.get(caller).copied().unwrap_or(0)
    }

    /// Every open session.
    pub fn all(&self) -> Vec<Arc<LiveSession>> {
        self.lock().sessions.values().cloned().collect()
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
    match &session.listen {
        Some(stream) => {
            if changed.tools {
                let _ = stream.notify_tool_list_changed().await;
            }
            if changed.resources {
                let _ = stream.notify_resource_list_changed().await;
            }
            if changed.prompts {
                let _ = stream.notify_prompt_list_changed().await;
            }
        }
        None => {
            if changed.tools {
                let _ = session.peer.notify_tool_list_changed().await;
            }
            if changed.resources {
                let _ = session.peer.notify_resource_list_changed().await;
            }
            if changed.prompts {
                let _ = session.peer.notify_prompt_list_changed().await;
            }
        }
    }
    metrics::counter!("mcp_gateway_notifications_total").increment(1);
}

/// Tells `session` that resource `uri` changed.
async fn notify_updated(session: &LiveSession, uri: &str) {
    let _ = match &session.listen {
        Some(stream) => stream.notify_resource_updated(uri).await.map_err(drop),
        None => session
            .peer
            .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
            .await
            .map_err(drop),
    };
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
                // A registry policy edit changes what its callers may use.
                let policies = if update.access_changed_since(&seen) {
                    changed_policies(&seen.access, &update.snapshot.access)
                } else {
                    Vec::new()
                };
                seen = update.snapshot.clone();
                for session in sessions.all() {
                    let concerned = policies.contains(&session.task.name)
                        || ids.iter().any(|id| {
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
                                        notify_updated(session, uri).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admissions_hold_both_caps_until_released() {
        let sessions = Arc::new(LiveSessions::default());
        let a1 = sessions.admit("a", 3, 2).expect("a 1");
        let a2 = sessions.admit("a", 3, 2).expect("a 2");
        assert_eq!(sessions.admit("a", 3, 2).err(), Some(Full::Caller(2)));
        let b1 = sessions.admit("b", 3, 2).expect("b 1");
        assert_eq!(sessions.admit("b", 3, 2).err(), Some(Full::Sessions(3)));
        assert_eq!(sessions.held_by("a"), 2);
        drop(a1);
        assert_eq!(sessions.held_by("a"), 1);
        let b2 = sessions.admit("b", 3, 2).expect("b 2 once a slot is free");
        drop((a2, b1, b2));
        assert_eq!(sessions.held_by("a") + sessions.held_by("b"), 0);
        assert!(sessions.admit("c", 3, 2).is_ok());
    }
}
