//! The pool's per-server health, in the shape the registry receives it.

use quiver_mcp::{HealthState, McpPool};
use quiver_proto::v1 as pb;
use quiver_sync::HealthSource;

/// The name of a state in JSON and logs.
pub fn state_name(state: HealthState) -> &'static str {
    match state {
        HealthState::Idle => "idle",
        HealthState::Connected => "connected",
        HealthState::Degraded => "degraded",
        HealthState::Down => "down",
    }
}

/// Feeds [`McpPool::health`] to the registry status reports.
pub struct PoolHealth(pub McpPool);

impl HealthSource for PoolHealth {
    fn server_health(&self) -> Vec<pb::ServerHealth> {
        self.0
            .health()
            .into_iter()
            .map(|health| pb::ServerHealth {
                server_id: health.server_id,
                state: match health.state {
                    HealthState::Idle => pb::ServerHealthState::Idle,
                    HealthState::Connected => pb::ServerHealthState::Connected,
                    HealthState::Degraded => pb::ServerHealthState::Degraded,
                    HealthState::Down => pb::ServerHealthState::Down,
                }
                .into(),
                last_error: health.last_error,
                reconnect_count: health.reconnects,
                tool_count: health.tool_count.and_then(|n| u32::try_from(n).ok()),
                p50_latency_ms: health.p50_latency_ms,
                session_connections: u32::try_from(health.sessions).unwrap_or(u32::MAX),
            })
            .collect()
    }
}
