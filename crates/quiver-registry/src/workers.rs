//! What workers last reported (R-SYNC-7, R-UI-5): snapshot revision and
//! per-server health. Kept in memory: it is soft state that every worker
//! re-sends periodically, and it is per registry replica.
//!
//! Anyone holding the worker token can report under any `worker_id`, so the
//! board is bounded ([`WorkerBoardOptions`]): reports are size-checked, a
//! worker that stops reporting expires, and once `max_workers` are tracked a
//! report from a new id is refused (RESOURCE_EXHAUSTED) rather than evicting
//! the stalest worker. Refusing keeps every worker an operator already sees
//! on the board; eviction would let a flood of made-up ids push real workers
//! off it, while a refused newcomer only misses being listed (its serving is
//! not affected) and says so in its log, until a place frees up by expiry.
//!
//! The per-worker gauges (`quiver_registry_worker_lag{worker_id}`,
//! `quiver_registry_worker_snapshot_revision{worker_id}`) are rendered from
//! the board itself ([`WorkerBoard::render_metrics`]), not through the
//! metrics recorder, which cannot forget a series: a worker's series end
//! when it expires.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use metrics_exporter_prometheus::formatting::sanitize_label_value;
use quiver_model::naming::is_invisible;
use serde::Serialize;

use crate::error::RegistryError;

/// Longest `worker_id`, in bytes.
pub const MAX_WORKER_ID_LEN: usize = 256;

/// Bounds of the worker board.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerBoardOptions {
    /// Workers tracked at once; a report from another worker id is refused
    /// with RESOURCE_EXHAUSTED until one expires.
    pub max_workers: usize,
    /// A worker without a report for this long is dropped, with its metric
    /// series.
    pub expiry: Duration,
    /// Servers one report may describe; more is INVALID_ARGUMENT.
    pub max_servers_per_report: usize,
    /// A server's `last_error` is cut to this many bytes.
    pub max_last_error_bytes: usize,
}

impl Default for WorkerBoardOptions {
    fn default() -> Self {
        WorkerBoardOptions {
            max_workers: 1024,
            expiry: Duration::from_secs(300),
            max_servers_per_report: 4096,
            max_last_error_bytes: 2048,
        }
    }
}

/// Health of one MCP server as a worker sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerHealth {
    /// The server.
    pub server_id: String,
    /// `connected`, `degraded`, `down` or `idle`.
    pub state: &'static str,
    /// Last error the worker saw (it may end with the server's stderr).
    pub last_error: Option<String>,
    /// Reconnects since the worker started.
    pub reconnect_count: u64,
    /// Tools the server offers, when known.
    pub tool_count: Option<u32>,
    /// Median call latency, when known.
    pub p50_latency_ms: Option<f64>,
    /// Live per-session connections (`isolation = "per_session"`).
    pub session_connections: u32,
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

/// A tracked worker: its report, when it came and the lag it had then.
#[derive(Debug)]
struct Entry {
    at: Instant,
    status: WorkerStatus,
    lag_at_report: u64,
}

/// The reports of every worker; cheap to clone.
#[derive(Clone, Default)]
pub struct WorkerBoard {
    options: Arc<WorkerBoardOptions>,
    reports: Arc<RwLock<HashMap<String, Entry>>>,
}

impl WorkerBoard {
    /// An empty board with these bounds.
    pub fn new(options: WorkerBoardOptions) -> Self {
        WorkerBoard {
            options: Arc::new(options),
            reports: Arc::default(),
        }
    }

    /// Records a report, replacing the worker's previous one; the registry's
    /// head was `head_revision` when it arrived. Refuses a malformed or
    /// oversized report (INVALID_ARGUMENT) and a new worker beyond
    /// `max_workers` (RESOURCE_EXHAUSTED); cuts long `last_error`s.
    pub fn report(
        &self,
        mut status: WorkerStatus,
        head_revision: u64,
    ) -> Result<(), RegistryError> {
        let refused = |reason: &'static str, err: RegistryError| {
            metrics::counter!("quiver_registry_worker_reports_refused_total", "reason" => reason)
                .increment(1);
            err
        };
        self.check(&status)
            .map_err(|err| refused("invalid_report", err))?;
        for server in &mut status.servers {
            if let Some(error) = &mut server.last_error {
                let cut = error.floor_char_boundary(self.options.max_last_error_bytes);
                error.truncate(cut);
            }
        }
        let mut reports = self
            .reports
            .write()
            .unwrap_or_else(|poison| poison.into_inner());
        let expiry = self.options.expiry;
        reports.retain(|_, entry| entry.at.elapsed() < expiry);
        if !reports.contains_key(&status.worker_id) && reports.len() >= self.options.max_workers {
            return Err(refused(
                "max_workers",
                RegistryError::ResourceExhausted(format!(
                    "the registry tracks at most {} workers (max_workers) and worker {:?} is not one of them; a place frees up when a worker has not reported for {} s",
                    self.options.max_workers,
                    status.worker_id,
                    expiry.as_secs()
                )),
            ));
        }
        let lag_at_report = head_revision.saturating_sub(status.snapshot_revision);
        reports.insert(
            status.worker_id.clone(),
            Entry {
                at: Instant::now(),
                status,
                lag_at_report,
            },
        );
        metrics::gauge!("quiver_registry_workers").set(reports.len() as f64);
        Ok(())
    }

    /// The shape of a report: a printable `worker_id`, valid server ids and
    /// at most `max_servers_per_report` of them.
    fn check(&self, status: &WorkerStatus) -> Result<(), RegistryError> {
        let id = &status.worker_id;
        if id.trim().is_empty() || id.len() > MAX_WORKER_ID_LEN {
            return Err(RegistryError::invalid(
                "worker_id",
                format!("must be 1 to {MAX_WORKER_ID_LEN} bytes"),
            ));
        }
        if let Some(c) = id.chars().find(|c| c.is_control() || is_invisible(*c)) {
            return Err(RegistryError::invalid(
                "worker_id",
                format!(
                    "must not contain control or invisible characters (found U+{:04X})",
                    u32::from(c)
                ),
            ));
        }
        let max = self.options.max_servers_per_report;
        if status.servers.len() > max {
            return Err(RegistryError::invalid(
                "servers",
                format!(
                    "a report describes at most {max} servers (max_servers_per_report), this one {}",
                    status.servers.len()
                ),
            ));
        }
        if let Some(i) = status
            .servers
            .iter()
            .position(|s| !quiver_model::is_valid_server_id(&s.server_id))
        {
            return Err(RegistryError::invalid(
                format!("servers[{i}].server_id"),
                "is not a valid server_id",
            ));
        }
        Ok(())
    }

    /// The live entries, ordered by worker id, mapped by `f`.
    fn live<T>(&self, f: impl Fn(&Entry) -> T) -> Vec<T> {
        let reports = self
            .reports
            .read()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut live: Vec<&Entry> = reports
            .values()
            .filter(|entry| entry.at.elapsed() < self.options.expiry)
            .collect();
        live.sort_by(|a, b| a.status.worker_id.cmp(&b.status.worker_id));
        live.into_iter().map(f).collect()
    }

    /// How many workers reported within the expiry (no report is copied:
    /// asked on every rate-limit lease).
    pub fn live_count(&self) -> usize {
        let reports = self
            .reports
            .read()
            .unwrap_or_else(|poison| poison.into_inner());
        reports
            .values()
            .filter(|entry| entry.at.elapsed() < self.options.expiry)
            .count()
    }

    /// Current reports, ordered by worker id.
    pub fn list(&self) -> Vec<WorkerStatus> {
        self.live(|entry| entry.status.clone())
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

    /// The per-worker gauges in the Prometheus text format, one series per
    /// live worker (the lag as of its last report), to append to the
    /// recorder's page.
    pub fn render_metrics(&self) -> String {
        let rows = self.live(|entry| {
            (
                sanitize_label_value(&entry.status.worker_id),
                entry.status.snapshot_revision,
                entry.lag_at_report,
            )
        });
        if rows.is_empty() {
            return String::new();
        }
        let mut page = String::new();
        for (name, help, lag) in [
            (
                "quiver_registry_worker_snapshot_revision",
                "registry revision of each worker's snapshot, as last reported",
                false,
            ),
            (
                "quiver_registry_worker_lag",
                "revisions each worker's snapshot was behind head at its last report",
                true,
            ),
        ] {
            let _ = writeln!(page, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (worker_id, snapshot_revision, lag_at_report) in &rows {
                let value = if lag {
                    lag_at_report
                } else {
                    snapshot_revision
                };
                let _ = writeln!(page, "{name}{{worker_id=\"{worker_id}\"}} {value}");
            }
            page.push('\n');
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(worker_id: &str, snapshot_revision: u64) -> WorkerStatus {
        WorkerStatus {
            worker_id: worker_id.into(),
            snapshot_revision,
            degraded: false,
            servers: Vec::new(),
            reported_at: Utc::now(),
        }
    }

    #[test]
    fn the_board_is_bounded_and_renders_live_workers_only() {
        let board = WorkerBoard::new(WorkerBoardOptions {
            max_workers: 2,
            expiry: Duration::from_millis(200),
            ..WorkerBoardOptions::default()
        });
        board.report(status("a", 3), 5).unwrap();
        board.report(status("b\"\\", 5), 5).unwrap();
        let err = board.report(status("c", 5), 5).unwrap_err();
        assert!(err.to_string().contains("max_workers"), "{err}");
        // A known worker may always report again.
        board.report(status("a", 4), 5).unwrap();
        assert_eq!(board.live_count(), 2);
        let page = board.render_metrics();
        assert!(
            page.contains("quiver_registry_worker_lag{worker_id=\"a\"} 1"),
            "{page}"
        );
        assert!(
            page.contains("quiver_registry_worker_snapshot_revision{worker_id=\"b\\\"\\\\\"} 5"),
            "{page}"
        );
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(board.render_metrics(), "");
        assert!(board.list().is_empty());
        assert_eq!(board.live_count(), 0, "expired reports are not live");
        board.report(status("c", 5), 5).unwrap();
    }

    #[test]
    fn last_errors_are_cut_on_a_character_boundary() {
        let board = WorkerBoard::new(WorkerBoardOptions {
            max_last_error_bytes: 5,
            ..WorkerBoardOptions::default()
        });
        let mut report = status("a", 1);
        report.servers.push(ServerHealth {
            server_id: "s".into(),
            state: "down",
            last_error: Some("ééé".into()),
            reconnect_count: 0,
            tool_count: None,
            session_connections: 0,
            p50_latency_ms: None,
        });
        board.report(report, 1).unwrap();
        assert_eq!(board.list()[0].servers[0].last_error.as_deref(), Some("éé"));
    }
}
