//! What workers last reported (R-SYNC-7, R-UI-5): snapshot revision and
//! per-server health. Kept in memory: it is soft state that every worker
//! re-sends periodically, and it is per registry replica.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Reports older than this are dropped (the worker is considered gone).
pub const WORKER_EXPIRY: Duration = Duration::from_secs(300);

/// Health of one MCP server as a worker sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerHealth {
    /// The server.
    pub server_id: String,
    /// `connected`, `degraded`, `down` or `idle`.
    pub state: &'static str,
    /// Last error the worker saw.
    pub last_error: Option<String>,
    /// Reconnects since the worker started.
    pub reconnect_count: u64,
    /// Tools the server offers, when known.
    pub tool_count: Option<u32>,
    /// Median call latency, when known.
    pub p50_latency_ms: Option<f64>,
}

/// One worker's last report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerStatus {
    /// Worker identity as reported.
    pub worker_id: String,
    /// Registry revision of the worker's snapshot.
    pub snapshot_revision: u64,
    /// Whether the worker serves a stale snapshot.
    pub degraded: bool,
    /// Per-server health.
    pub servers: Vec<ServerHealth>,
    /// When the report arrived.
    pub reported_at: DateTime<Utc>,
}

/// A worker's last report as the admin API lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerListing {
    /// The report.
    #[serde(flatten)]
    pub status: WorkerStatus,
    /// Revisions the worker's snapshot is behind the registry's head; 0 when
    /// it is level or ahead (a worker fed by another replica may be ahead of
    /// this one for a moment).
    pub lag: u64,
}

/// The reports of every worker; cheap to clone.
#[derive(Clone, Default)]
pub struct WorkerBoard {
    reports: Arc<RwLock<HashMap<String, (Instant, WorkerStatus)>>>,
}

impl WorkerBoard {
    /// Records a report, replacing the worker's previous one.
    pub fn report(&self, status: WorkerStatus) {
        let mut reports = self
            .reports
            .write()
            .unwrap_or_else(|poison| poison.into_inner());
        reports.retain(|_, (at, _)| at.elapsed() < WORKER_EXPIRY);
        reports.insert(status.worker_id.clone(), (Instant::now(), status));
    }

    /// Current reports, ordered by worker id.
    pub fn list(&self) -> Vec<WorkerStatus> {
        let reports = self
            .reports
            .read()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut list: Vec<_> = reports
            .values()
            .filter(|(at, _)| at.elapsed() < WORKER_EXPIRY)
            .map(|(_, status)| status.clone())
            .collect();
        list.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        list
    }

    /// [`WorkerBoard::list`] with each worker's lag behind `head_revision`.
    pub fn list_behind(&self, head_revision: u64) -> Vec<WorkerListing> {
        self.list()
            .into_iter()
            .map(|status| WorkerListing {
                lag: head_revision.saturating_sub(status.snapshot_revision),
                status,
            })
            .collect()
    }
}
