//! What the pool's entries share: the settings, the entries and leases,
//! the worker-wide semaphores and the event channel; the cheap handle onto
//! them ([`McpPool`]), whose methods the modules above add; and the ends
//! of entries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

use super::entry::Entry;
use super::options::PoolOptions;
use crate::connection::Connection;
use crate::leases::Leases;
use crate::relay::ServerEvent;

pub(super) struct PoolInner {
    pub(super) options: PoolOptions,
    pub(super) entries: Mutex<HashMap<String, Arc<Entry>>>,
    pub(super) inflight: Arc<Semaphore>,
    pub(super) children: Arc<Semaphore>,
    pub(super) events: broadcast::Sender<ServerEvent>,
    /// Connections of per-session servers, one per (server, task, session).
    pub(super) leases: Leases<Arc<Entry>>,
    pub(super) shutdown: CancellationToken,
}

/// Handle to the pool; cheap to clone.
#[derive(Clone)]
pub struct McpPool {
    pub(super) inner: Arc<PoolInner>,
}

impl PoolInner {
    pub(super) fn entries(&self) -> MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn child_processes(&self) -> usize {
        self.options.max_child_processes.max(1) - self.children.available_permits()
    }

    /// Sets `mcp_child_processes` to the children alive now; called wherever
    /// a child slot is taken or may have been given back.
    pub(super) fn update_child_gauge(&self) {
        metrics::gauge!("mcp_child_processes").set(self.child_processes() as f64);
    }

    /// After a failed request: forgets `connection` if it closed (the
    /// server crashed, or the worker recycled it), so the next call opens
    /// a new one.
    pub(super) async fn forget_if_closed(&self, entry: &Entry, connection: Arc<Connection>) {
        if connection.is_closed() {
            entry.discard(&connection).await;
            // The child slot is given back with the last handle.
            drop(connection);
            self.update_child_gauge();
        }
    }
}

/// Closes a replaced or removed entry's connection once the calls in flight
/// on it are done, so they are never cut off.
pub(super) fn retire(entry: Arc<Entry>, pool: Weak<PoolInner>) {
    tokio::spawn(async move {
        if let Some(connection) = entry.link.recycle() {
            let calls = entry.calls.load_full();
            let all = (entry.server.load().spec.budgets.max_concurrency).max(1);
            let drained = calls.acquire_many(all).await;
            entry.discard(&connection).await;
            // The child slot is given back when the last handle goes.
            drop((connection, drained, entry));
            if let Some(pool) = pool.upgrade() {
                pool.update_child_gauge();
            }
        }
    });
}
