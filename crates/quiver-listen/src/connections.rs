//! The open connections of a process's listeners, under one cap, and the
//! deadline each one is held to.
//!
//! A connection is *busy* while a request it carries is being served (from
//! the complete request head until its response body is done) and *idle*
//! otherwise: before its first request head is complete (a TLS handshake, an
//! HTTP/2 preface, a head that never ends) or between requests. Only idle
//! connections have a deadline, and only idle ones are closed to make room
//! for a new connection at the cap, oldest first; a connection in the
//! middle of a request is never cut off for a newcomer.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::descriptors::raise_descriptor_limit;
use crate::options::ListenerOptions;

/// Marks a connection chosen to make room at the cap (the other bits of
/// the state count its requests in flight).
const EVICTED: u64 = 1 << 63;

/// How often at most the cap is reported in the log while shedding.
const SHED_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// Why a connection was closed (or refused) by the listener rather than by
/// its peer: the `reason` label of `http_connections_shed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shed {
    /// New connection refused at the cap: every open one was busy.
    AtCapacity,
    /// Idle connection closed to make room for a new one at the cap.
    Evicted,
    /// No complete first request head within the header-read timeout.
    HeaderTimeout,
    /// No request within the idle timeout after the last response.
    IdleTimeout,
}

impl Shed {
    fn label(self) -> &'static str {
        match self {
            Shed::AtCapacity => "at_capacity",
            Shed::Evicted => "evicted",
            Shed::HeaderTimeout => "header_timeout",
            Shed::IdleTimeout => "idle_timeout",
        }
    }

    pub(crate) fn count(self, listener: &'static str) {
        metrics::counter!("http_connections_shed_total", "listener" => listener, "reason" => self.label())
            .increment(1);
    }
}

/// The open connections of every listener of one process, under one cap
/// (descriptors are a per-process resource). Cheap to clone.
#[derive(Clone)]
pub struct Connections {
    table: Arc<Table>,
}

struct Table {
    options: ListenerOptions,
    max_connections: usize,
    started: Instant,
    open: Mutex<Open>,
    /// When the cap was last reported in the log (ms since `started`, plus one).
    last_shed_warning_ms: AtomicU64,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    /// Keyed by admission order: the first entries are the oldest.
    by_age: BTreeMap<u64, Arc<Connection>>,
}

impl Connections {
    /// The connection table of a process: raises the soft descriptor limit
    /// to the hard one and derives the cap from it unless
    /// [`ListenerOptions::max_connections`] sets one.
    pub fn new(options: ListenerOptions) -> Self {
        let descriptor_limit = raise_descriptor_limit();
        let max_connections = options.max_connections_under(descriptor_limit);
        tracing::debug!(max_connections, descriptor_limit, "listener connection cap");
        Connections {
            table: Arc::new(Table {
                options,
                max_connections,
                started: Instant::now(),
                open: Mutex::default(),
                last_shed_warning_ms: AtomicU64::new(0),
            }),
        }
    }

    /// The cap on open connections in force.
    pub fn max_connections(&self) -> usize {
        self.table.max_connections
    }

    /// The options every connection is held to.
    pub fn options(&self) -> &ListenerOptions {
        &self.table.options
    }

    /// Registers a new connection of `listener`. At the cap, the oldest idle
    /// connection is closed to make room; when every open connection is
    /// busy, the new one is refused (`None`: close it at once).
    pub(crate) fn admit(&self, listener: &'static str) -> Option<Admitted> {
        let mut open = self.table.lock();
        if open.by_age.len() >= self.table.max_connections {
            let Some(oldest_idle) = open.by_age.values().find(|c| c.try_evict()).cloned() else {
                drop(open);
                Shed::AtCapacity.count(listener);
                self.table.warn_shedding(listener);
                return None;
            };
            open.by_age.remove(&oldest_idle.id);
            metrics::gauge!("http_connections_open", "listener" => oldest_idle.listener)
                .decrement(1.0);
            oldest_idle.changed.notify_one();
            self.table.warn_shedding(listener);
        }
        let id = open.next_id;
        open.next_id += 1;
        let connection = Arc::new(Connection {
            id,
            listener,
            admitted: Instant::now(),
            state: AtomicU64::new(0),
            served: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            changed: Notify::new(),
        });
        open.by_age.insert(id, connection.clone());
        drop(open);
        metrics::gauge!("http_connections_open", "listener" => listener).increment(1.0);
        Some(Admitted {
            connection,
            table: self.table.clone(),
        })
    }
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn warn_shedding(&self, listener: &'static str) {
        let now_ms = millis(self.started.elapsed()) + 1;
        let last = self.last_shed_warning_ms.load(Ordering::Relaxed);
        if last != 0 && now_ms < last + millis(SHED_WARNING_INTERVAL) {
            return;
        }
        if self
            .last_shed_warning_ms
            .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                listener,
                max_connections = self.max_connections,
                "connection cap reached; closing idle connections and refusing new ones while every connection is busy (see http_connections_shed_total)"
            );
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One open connection's state, shared by its task, its requests and the
/// table.
pub(crate) struct Connection {
    id: u64,
    listener: &'static str,
    admitted: Instant,
    /// Requests in flight, plus [`EVICTED`] once chosen to make room.
    state: AtomicU64,
    /// Whether a complete request head ever arrived.
    served: AtomicBool,
    /// When the last request ended, in ms since `admitted`.
    idle_since_ms: AtomicU64,
    /// Wakes [`Connection::closed`]: evicted, or the last request ended.
    changed: Notify,
}

impl Connection {
    /// Marks a complete request head; the connection is busy until the
    /// returned guard (carried by the response body) is dropped.
    pub(crate) fn request_started(self: &Arc<Self>) -> RequestGuard {
        self.served.store(true, Ordering::Release);
        self.state.fetch_add(1, Ordering::AcqRel);
        RequestGuard {
            connection: self.clone(),
        }
    }

    /// Claims this connection for eviction if it is idle.
    fn try_evict(&self) -> bool {
        self.state
            .compare_exchange(0, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Resolves when the listener must close this connection, with why:
    /// evicted, or idle past its deadline. Never resolves while busy.
    pub(crate) async fn closed(&self, options: &ListenerOptions) -> Shed {
        loop {
            let state = self.state.load(Ordering::Acquire);
            if state & EVICTED != 0 {
                return Shed::Evicted;
            }
            if state != 0 {
                self.changed.notified().await;
                continue;
            }
            let (deadline, reason) = if self.served.load(Ordering::Acquire) {
                let idle_since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
                (
                    self.admitted + idle_since + options.idle_timeout,
                    Shed::IdleTimeout,
                )
            } else {
                (
                    self.admitted + options.header_read_timeout,
                    Shed::HeaderTimeout,
                )
            };
            if Instant::now() >= deadline {
                return reason;
            }
            tokio::select! {
                () = self.changed.notified() => {}
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }
}

/// A request in flight on a connection (see [`Connection::request_started`]).
pub(crate) struct RequestGuard {
    connection: Arc<Connection>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let connection = &self.connection;
        connection
            .idle_since_ms
            .store(millis(connection.admitted.elapsed()), Ordering::Release);
        if connection.state.fetch_sub(1, Ordering::AcqRel) & !EVICTED == 1 {
            connection.changed.notify_one();
        }
    }
}

/// An admitted connection: leaves the table when dropped (its task ended).
pub(crate) struct Admitted {
    connection: Arc<Connection>,
    table: Arc<Table>,
}

impl Admitted {
    pub(crate) fn connection(&self) -> &Arc<Connection> {
        &self.connection
    }

    pub(crate) fn options(&self) -> &ListenerOptions {
        &self.table.options
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        // An evicted connection already left the table (and the gauge).
        let removed = self.table.lock().by_age.remove(&self.connection.id);
        if removed.is_some() {
            metrics::gauge!("http_connections_open", "listener" => self.connection.listener)
                .decrement(1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(max_connections: usize) -> Connections {
        Connections::new(ListenerOptions {
            max_connections: Some(max_connections),
            header_read_timeout: Duration::from_millis(50),
            idle_timeout: Duration::from_millis(100),
            ..ListenerOptions::default()
        })
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_makes_room() {
        let connections = table(2);
        let busy = connections.admit("test").unwrap();
        let _request = busy.connection().request_started();
        let idle = connections.admit("test").unwrap();
        let newcomer = connections.admit("test").expect("room made");
        assert_eq!(idle.connection().state.load(Ordering::Acquire), EVICTED);
        assert_eq!(busy.connection().state.load(Ordering::Acquire), 1);
        // Both left are busy now: the next one is refused.
        let _second = newcomer.connection().request_started();
        assert!(connections.admit("test").is_none());
        drop(idle);
        assert_eq!(connections.table.lock().by_age.len(), 2);
    }

    #[tokio::test]
    async fn deadlines_apply_only_while_idle() {
        let connections = table(8);
        let admitted = connections.admit("test").unwrap();
        let options = admitted.options().clone();
        let connection = admitted.connection().clone();
        let started = Instant::now();
        assert_eq!(connection.closed(&options).await, Shed::HeaderTimeout);
        assert!(started.elapsed() >= Duration::from_millis(50));

        let request = connection.request_started();
        let waited = tokio::time::timeout(Duration::from_millis(200), connection.closed(&options));
        assert!(waited.await.is_err(), "busy connection got a deadline");
        drop(request);
        let started = Instant::now();
        assert_eq!(connection.closed(&options).await, Shed::IdleTimeout);
        assert!(started.elapsed() >= Duration::from_millis(90));
    }

    #[tokio::test]
    async fn eviction_wakes_the_connection() {
        let connections = table(1);
        let first = connections.admit("test").unwrap();
        let options = first.options().clone();
        let connection = first.connection().clone();
        let closed = tokio::spawn(async move { connection.closed(&options).await });
        tokio::task::yield_now().await;
        let _second = connections.admit("test").unwrap();
        let reason = tokio::time::timeout(Duration::from_millis(40), closed).await;
        assert_eq!(
            reason.expect("woken before its deadline").unwrap(),
            Shed::Evicted
        );
    }
}
