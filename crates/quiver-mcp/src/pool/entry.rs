//! One entry of the pool: a server's record, how it is launched, its
//! connection state, its call slots, what its server sends, and how its
//! calls went. Each server has one; a `per_session` server or a per-user
//! OAuth connection has one more per lease.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use quiver_model::{McpServerSpec, StoredServer};
use tokio::sync::Semaphore;

use super::options::PoolOptions;
use super::state::Link;
use crate::connection::{Connection, StderrTail};
use crate::error::McpError;
use crate::launch::{Launch, launch};
use crate::relay::Relay;
use crate::server_log::ServerLog;
use crate::tools::ToolsCache;

const LATENCY_WINDOW: usize = 64;

/// How an entry's calls went, for health and the idle reaper.
struct Activity {
    last_used: Instant,
    /// The last error a call, listing or connect saw.
    last_error: Option<String>,
    /// Calls failed since the last one that succeeded.
    failed_calls: u64,
    /// The last listing failed (or was not answered in time); cleared by
    /// one that succeeds.
    listing_failed: bool,
    /// Recent call latencies in ms, newest last.
    latencies: VecDeque<f64>,
}

pub(super) struct Entry {
    /// The record; replaced in place when a change keeps the connection.
    pub(super) server: ArcSwap<StoredServer>,
    /// The newest revision this entry's record has had. After a registry
    /// restored from a backup the record can be older than that, and a call
    /// holding a record resolved before the restore must not bring it back.
    pub(super) newest_revision: AtomicU64,
    pub(super) launch: Result<Launch, McpError>,
    pub(super) link: Link,
    /// `max_concurrency` permits; replaced when the budget changes (calls in
    /// flight keep the permits of the old one).
    pub(super) calls: ArcSwap<Semaphore>,
    pub(super) tools: Arc<ToolsCache>,
    /// Calls in flight, for what the server sends about them.
    pub(super) relay: Arc<Relay>,
    pub(super) stderr: StderrTail,
    pub(super) log: ServerLog,
    activity: Mutex<Activity>,
    /// A per-session lease (counted in `mcp_session_connections` while it lives).
    lease: bool,
    /// Whose grant the entry's connection carries (a per-user OAuth
    /// connection's lease); `None`: the fleet-wide one.
    pub(super) principal: Option<String>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.lease {
            metrics::gauge!("mcp_session_connections", "server_id" => self.server_id())
                .decrement(1.0);
        }
    }
}

fn call_slots(spec: &McpServerSpec) -> Semaphore {
    Semaphore::new((spec.budgets.max_concurrency as usize).max(1))
}

impl Entry {
    /// The server's own entry.
    pub(super) fn new(server: Arc<StoredServer>, options: &PoolOptions) -> Self {
        Entry::owned(server, options, false, None)
    }

    /// A lease of the server for one session, or for `principal`'s own
    /// grant; counted in `mcp_session_connections` until dropped.
    pub(super) fn leased(
        server: Arc<StoredServer>,
        options: &PoolOptions,
        principal: Option<String>,
    ) -> Self {
        metrics::gauge!("mcp_session_connections", "server_id" => server.spec.server_id.clone())
            .increment(1.0);
        Entry::owned(server, options, true, principal)
    }

    fn owned(
        server: Arc<StoredServer>,
        options: &PoolOptions,
        lease: bool,
        principal: Option<String>,
    ) -> Self {
        Entry {
            launch: launch(&server.spec, &options.env)
                .and_then(|launch| options.egress.check_launch(&launch).map(|()| launch)),
            calls: ArcSwap::from_pointee(call_slots(&server.spec)),
            log: ServerLog::new(&server.spec.server_id),
            newest_revision: AtomicU64::new(server.revision),
            server: ArcSwap::new(server),
            link: Link::default(),
            tools: Arc::default(),
            relay: Arc::default(),
            stderr: StderrTail::default(),
            activity: Mutex::new(Activity {
                last_used: Instant::now(),
                last_error: None,
                failed_calls: 0,
                listing_failed: false,
                latencies: VecDeque::with_capacity(LATENCY_WINDOW),
            }),
            lease,
            principal,
        }
    }

    /// Takes another record that needs no new connection.
    pub(super) fn update(&self, server: &Arc<StoredServer>) {
        self.newest_revision
            .fetch_max(server.revision, Ordering::Relaxed);
        let old = self.server.swap(server.clone());
        if old.spec.budgets.max_concurrency != server.spec.budgets.max_concurrency {
            self.calls.store(Arc::new(call_slots(&server.spec)));
        }
        self.tools.clear();
    }

    pub(super) fn server_id(&self) -> String {
        self.server.load().spec.server_id.clone()
    }

    /// Whether no call holds a `max_concurrency` slot.
    pub(super) fn no_calls(&self) -> bool {
        let budget = (self.server.load().spec.budgets.max_concurrency as usize).max(1);
        self.calls.load().available_permits() == budget
    }

    /// Forgets a connection that died (if it is still the current one).
    pub(super) async fn discard(&self, dead: &Arc<Connection>) {
        self.link.forget(dead);
        dead.close().await;
    }

    fn activity(&self) -> MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn touch(&self) {
        self.activity().last_used = Instant::now();
    }

    pub(super) fn unused_for(&self) -> Duration {
        self.activity().last_used.elapsed()
    }

    /// Keeps `error` as the entry's last error.
    pub(super) fn set_error(&self, error: &McpError) {
        self.activity().last_error = Some(error.to_string());
    }

    /// A request was answered in `duration`; `succeeded`: it was a call
    /// that succeeded, which clears the run of failed calls.
    pub(super) fn answered(&self, duration: Duration, succeeded: bool) {
        let mut activity = self.activity();
        if activity.latencies.len() == LATENCY_WINDOW {
            activity.latencies.pop_front();
        }
        activity
            .latencies
            .push_back(duration.as_secs_f64() * 1000.0);
        if succeeded {
            activity.failed_calls = 0;
        }
    }

    /// A call failed with `error`.
    pub(super) fn call_failed(&self, error: &McpError) {
        let mut activity = self.activity();
        activity.failed_calls += 1;
        activity.last_error = Some(error.to_string());
    }

    /// A listing ended; a failure is also the entry's last error.
    pub(super) fn listed(&self, outcome: Result<(), &McpError>) {
        let mut activity = self.activity();
        activity.listing_failed = outcome.is_err();
        if let Err(error) = outcome {
            activity.last_error = Some(error.to_string());
        }
    }

    /// What health reads besides the connection state.
    pub(super) fn report(&self) -> Report {
        let activity = self.activity();
        let p50 = (!activity.latencies.is_empty()).then(|| {
            let mut sorted: Vec<f64> = activity.latencies.iter().copied().collect();
            sorted.sort_by(f64::total_cmp);
            sorted[sorted.len() / 2]
        });
        Report {
            last_error: activity.last_error.clone(),
            failing: activity.failed_calls > 0 || activity.listing_failed,
            listing_failed: activity.listing_failed,
            p50_latency_ms: p50,
        }
    }
}

/// How an entry's calls went, as health reports it.
pub(super) struct Report {
    pub(super) last_error: Option<String>,
    /// Calls or the last listing failed since the last success.
    pub(super) failing: bool,
    pub(super) listing_failed: bool,
    pub(super) p50_latency_ms: Option<f64>,
}
