//! What the handlers share.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use quiver_sync::SnapshotHandle;
use quiver_upstream::Upstream;

use crate::auth::Callers;
use crate::call::ToolRunner;
use crate::gateway::Gateway;
use crate::gateway::rebinding::RebindingGuard;

/// The state of the worker's HTTP edge.
#[derive(Clone)]
pub struct ApiState {
    /// The registry snapshot.
    pub snapshot: SnapshotHandle,
    /// Runs tools over the MCP pool.
    pub runner: ToolRunner,
    /// Caller credentials.
    pub callers: Arc<Callers>,
    /// The chat upstream, when configured.
    pub upstream: Option<Upstream>,
    /// The MCP endpoints' server.
    pub gateway: Gateway,
    /// `Host`/`Origin` checks of the MCP endpoints.
    pub rebinding: Arc<RebindingGuard>,
    /// Prometheus recorder, when installed.
    pub metrics: Option<PrometheusHandle>,
    /// OAuth access tokens of records with `http.auth_ref`.
    pub tokens: Option<crate::oauth_tokens::TokenCache>,
}
