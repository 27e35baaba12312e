//! The worker's pool of MCP connections (R-MCP-2…5, R-MCP-7).
//!
//! One entry per server id holds at most one live connection (shared
//! isolation), multiplexing every call of every session. Connections open
//! lazily on first use (or by warm-up), close after an idle period, and are
//! re-opened after a crash; consecutive failures to connect back off
//! exponentially with jitter, so a broken server costs one fast error per
//! call instead of a spawn per call. Every failure stays inside its entry:
//! other servers never wait on it.
//!
//! Modules depend one way, each only on modules listed before it:
//! `options` (settings) ← `backoff` (delays after failed connects) ←
//! `state` (an entry's connection state machine) ← `entry` (one server's
//! entry) ← `inner` (what entries share; the [`McpPool`] handle) ←
//! `lookup` (which entry serves a request) ← `connect` (single-flight
//! connect) ← `call` (`tools/call` and forwarded requests) ← `list` (tool
//! listings); `health` and `reap` (idle connections) read `state`,
//! `entry` and `inner`. This module starts and ends the pool; nothing
//! imports it.

mod backoff;
mod call;
mod connect;
mod entry;
mod health;
mod inner;
mod list;
mod lookup;
mod options;
mod reap;
mod state;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

pub use call::{
    CallOptions, CallOutcome, ForwardError, UpstreamInput, forwarded_meta, is_forwarded_meta_key,
};
pub use health::{HealthState, ServerHealth};
pub use inner::McpPool;
pub use options::PoolOptions;

use crate::leases::Leases;
use crate::relay::{EVENT_CHANNEL_CAPACITY, ServerEvent};
use inner::PoolInner;

impl McpPool {
    /// An empty pool; the idle reaper runs until [`McpPool::shutdown`].
    pub fn new(options: PoolOptions) -> Self {
        let inner = Arc::new(PoolInner {
            inflight: Arc::new(Semaphore::new(options.max_inflight_calls.max(1))),
            children: Arc::new(Semaphore::new(options.max_child_processes.max(1))),
            leases: Leases::new(options.session_leases),
            options,
            entries: Mutex::new(HashMap::new()),
            events: broadcast::channel(EVENT_CHANNEL_CAPACITY).0,
            shutdown: CancellationToken::new(),
        });
        reap::spawn_reapers(&inner);
        McpPool { inner }
    }

    /// Changes servers announce (list changes, resource updates), for every
    /// subscriber; see [`crate::relay`].
    pub fn events(&self) -> broadcast::Receiver<ServerEvent> {
        self.inner.events.subscribe()
    }

    /// Number of stdio children alive.
    pub fn child_processes(&self) -> usize {
        self.inner.child_processes()
    }

    /// Closes every connection and kills every child process group.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        let mut entries: Vec<_> = self
            .inner
            .entries()
            .drain()
            .map(|(_, entry)| entry)
            .collect();
        entries.extend(self.inner.leases.remove_where(|_, _, _| true));
        let closing = entries.into_iter().filter_map(|entry| {
            let connection = entry.link.close();
            connection.map(|connection| async move { connection.close().await })
        });
        futures::future::join_all(closing).await;
        self.inner.update_child_gauge();
    }
}
