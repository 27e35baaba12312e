//! What the pool tells the registry about each server (R-MCP-5): the
//! entry's connection state, read as it is, and how its calls went.

use super::entry::{Entry, Report};
use super::inner::McpPool;
use super::state::ConnectionState;

/// Connection state of one server, as reported to the registry (R-MCP-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    /// Never connected yet (lazy).
    Idle,
    /// A live connection.
    Connected,
    /// Live, but recent calls or restarts failed.
    Degraded,
    /// The last connect failed, or its record cannot be launched on this worker.
    Down,
}

/// Health of one server on this worker.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerHealth {
    /// The server.
    pub server_id: String,
    /// State.
    pub state: HealthState,
    /// Last error seen.
    pub last_error: Option<String>,
    /// Connections opened after the first one.
    pub reconnects: u64,
    /// Tools in the cached list, when known.
    pub tool_count: Option<usize>,
    /// Median of recent call latencies.
    pub p50_latency_ms: Option<f64>,
    /// Pid of the live stdio child.
    pub pid: Option<u32>,
    /// The protocol version the live connection settled on (`None`
    /// without one).
    pub protocol_version: Option<String>,
    /// Live per-session connections (`isolation = "per_session"`).
    pub sessions: usize,
    /// Last stderr lines of the server.
    pub stderr_tail: Vec<String>,
    /// Last log messages the server sent (`notifications/message`).
    pub log_tail: Vec<String>,
}

/// The health state of an entry in `state` whose calls went as `report`
/// says (`launchable`: its record can be launched on this worker).
fn health_state(launchable: bool, state: &ConnectionState, report: &Report) -> HealthState {
    match state {
        _ if !launchable => HealthState::Down,
        ConnectionState::Ready(connection) | ConnectionState::Recycling(connection)
            if !connection.is_closed() =>
        {
            if report.failing {
                HealthState::Degraded
            } else {
                HealthState::Connected
            }
        }
        // Down until a connect succeeds again, not only while backing off.
        ConnectionState::BackingOff { .. }
        | ConnectionState::AtChildCap
        | ConnectionState::Connecting { retrying: true } => HealthState::Down,
        _ if report.listing_failed => HealthState::Down,
        _ => HealthState::Idle,
    }
}

impl McpPool {
    /// Health of every server the pool knows (R-MCP-5).
    pub fn health(&self) -> Vec<ServerHealth> {
        let entries: Vec<_> = self.inner.entries().values().cloned().collect();
        let sessions = self.inner.leases.counts();
        let mut health: Vec<_> = entries
            .iter()
            .map(|entry| entry_health(entry, &sessions))
            .collect();
        health.sort_by(|a, b| a.server_id.cmp(&b.server_id));
        health
    }
}

fn entry_health(
    entry: &Entry,
    sessions: &std::collections::HashMap<String, usize>,
) -> ServerHealth {
    let view = entry.link.view();
    let report = entry.report();
    let state = health_state(entry.launch.is_ok(), &view.state, &report);
    let connection = match &view.state {
        ConnectionState::Ready(connection) | ConnectionState::Recycling(connection) => {
            Some(connection)
        }
        _ => None,
    };
    let last_error = match (&entry.launch, &view.state) {
        (Err(err), _) => Some(err.to_string()),
        (Ok(_), ConnectionState::BackingOff { cause, .. }) => Some(cause.to_string()),
        (Ok(_), _) => report.last_error,
    };
    let server_id = entry.server_id();
    ServerHealth {
        state,
        last_error,
        reconnects: view.connects.saturating_sub(1),
        tool_count: entry.tools.cached_len(),
        p50_latency_ms: report.p50_latency_ms,
        pid: connection.and_then(|c| c.pid()),
        protocol_version: connection
            .filter(|c| !c.is_closed())
            .map(|c| c.protocol_version().to_string()),
        sessions: sessions.get(&server_id).copied().unwrap_or(0),
        stderr_tail: entry.stderr.lines(),
        log_tail: entry.log.lines(),
        server_id,
    }
}
