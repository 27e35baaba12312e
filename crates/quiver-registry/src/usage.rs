//! Fleet-wide rate limits and usage (docs/reference.md §12.3): the tonic
//! `McpUsageService` workers lease shares of rate-limit windows from and
//! report usage counts to, and the sweep that keeps the usage tables within
//! their retention. `GET /admin/api/usage` reads them (`rest::usage`).
//!
//! Why leases: every call of every worker must count against one window
//! without a store beyond the registry's database. A worker that asks for
//! a share of the window (a few calls, more for large limits) answers calls
//! from it locally and gives back what it did not use, so the registry is
//! asked once per share, not once per call, and the database never grants
//! more than the limit in all (`quiver_store::Store::lease_calls`).

use std::time::Duration;

use chrono::Utc;
use quiver_model::usage::{LATENCY_BUCKETS, MINUTE_MS, UsageCounts, UsageKey};
use quiver_proto::v1 as pb;
use quiver_proto::v1::mcp_usage_service_server::McpUsageService;
use quiver_store::{MAX_USAGE_BATCH_ROWS, UsageBatch};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response as GrpcResponse, Status};

use crate::auth::Need;
use crate::error::RegistryError;
use crate::grpc::GrpcService;
use crate::state::RegistryState;

/// Usage rows are kept this long unless configured otherwise.
pub const DEFAULT_USAGE_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// How often the sweep deletes usage past retention and ended windows.
const SWEEP_INTERVAL: Duration = Duration::from_secs(600);
/// Longest counter key a worker may send.
const MAX_KEY_BYTES: usize = 1024;
/// Longest name (principal, policy, server, tool) in a usage row.
const MAX_NAME_BYTES: usize = 512;

/// The service; wraps the shared registry state.
#[derive(Clone)]
pub struct GrpcUsageService {
    inner: GrpcService,
    state: RegistryState,
}

impl GrpcUsageService {
    /// A service over `state`.
    pub fn new(state: RegistryState) -> Self {
        GrpcUsageService {
            inner: GrpcService::new(state.clone()),
            state,
        }
    }
}

fn check_key(key: &str) -> Result<(), RegistryError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(RegistryError::invalid(
            "key",
            format!("must be 1 to {MAX_KEY_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn usage_row(index: usize, row: pb::UsageRow) -> Result<(UsageKey, UsageCounts), RegistryError> {
    let field = |name: &str| format!("rows[{index}].{name}");
    for (name, value) in [
        ("principal", &row.principal),
        ("policy", &row.policy),
        ("server_id", &row.server_id),
        ("tool", &row.tool),
    ] {
        if value.len() > MAX_NAME_BYTES {
            return Err(RegistryError::invalid(
                field(name),
                format!("at most {MAX_NAME_BYTES} bytes"),
            ));
        }
    }
    if row.minute_ms % MINUTE_MS != 0 {
        return Err(RegistryError::invalid(
            field("minute_ms"),
            "must be the start of a minute",
        ));
    }
    let latency: [u64; LATENCY_BUCKETS] = row.latency_buckets.try_into().map_err(|_| {
        RegistryError::invalid(
            field("latency_buckets"),
            format!("must have {LATENCY_BUCKETS} buckets"),
        )
    })?;
    Ok((
        UsageKey {
            principal: row.principal,
            policy: row.policy,
            server_id: row.server_id,
            tool: row.tool,
            minute_ms: row.minute_ms,
        },
        UsageCounts {
            calls: row.calls,
            errors: row.errors,
            rate_limited: row.rate_limited,
            latency,
        },
    ))
}

#[tonic::async_trait]
impl McpUsageService for GrpcUsageService {
    async fn lease_calls(
        &self,
        request: Request<pb::LeaseCallsRequest>,
    ) -> Result<GrpcResponse<pb::LeaseCallsResponse>, Status> {
        self.inner.role(&request, Need::Worker)?;
        let body = request.into_inner();
        check_key(&body.key)?;
        if body.calls == 0 {
            return Err(RegistryError::invalid("calls", "must be at least 1").into());
        }
        if body.per_s == 0 || body.per_s > quiver_model::rate_limit::MAX_WINDOW_SECS {
            return Err(RegistryError::invalid("per_s", "must be 1 to 86400").into());
        }
        let lease = self
            .state
            .store
            .lease_calls(&body.key, body.calls, body.per_s, body.want.max(1))
            .await
            .map_err(RegistryError::from)?;
        let live_workers = u32::try_from(self.state.workers.live_count()).unwrap_or(u32::MAX);
        Ok(GrpcResponse::new(pb::LeaseCallsResponse {
            granted: lease.granted,
            window_id: lease.window_start_ms,
            window_remaining_ms: lease.remaining_ms,
            live_workers: live_workers.max(1),
        }))
    }

    async fn return_calls(
        &self,
        request: Request<pb::ReturnCallsRequest>,
    ) -> Result<GrpcResponse<pb::ReturnCallsResponse>, Status> {
        self.inner.role(&request, Need::Worker)?;
        let body = request.into_inner();
        check_key(&body.key)?;
        self.state
            .store
            .give_back_calls(&body.key, body.window_id, body.calls)
            .await
            .map_err(RegistryError::from)?;
        Ok(GrpcResponse::new(pb::ReturnCallsResponse {}))
    }

    async fn report_usage(
        &self,
        request: Request<pb::ReportUsageRequest>,
    ) -> Result<GrpcResponse<pb::ReportUsageResponse>, Status> {
        self.inner.role(&request, Need::Worker)?;
        let body = request.into_inner();
        if body.source.is_empty() || body.source.len() > MAX_NAME_BYTES {
            return Err(RegistryError::invalid(
                "source",
                format!("must be 1 to {MAX_NAME_BYTES} bytes"),
            )
            .into());
        }
        if body.rows.len() > MAX_USAGE_BATCH_ROWS {
            return Err(RegistryError::invalid(
                "rows",
                format!("at most {MAX_USAGE_BATCH_ROWS} rows per batch"),
            )
            .into());
        }
        let rows = body
            .rows
            .into_iter()
            .enumerate()
            .map(|(i, row)| usage_row(i, row))
            .collect::<Result<Vec<_>, _>>()?;
        self.state
            .store
            .record_usage(&UsageBatch {
                source: body.source,
                batch_id: body.batch_id,
                rows,
            })
            .await
            .map_err(RegistryError::from)?;
        Ok(GrpcResponse::new(pb::ReportUsageResponse {}))
    }
}

/// Deletes usage rows past `retention` and ended windows, every few minutes
/// until shutdown.
pub(crate) async fn sweep_periodically(
    state: RegistryState,
    retention: Duration,
    shutdown: CancellationToken,
) {
    let mut timer = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        let before = Utc::now().timestamp_millis()
            - i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        match state.store.prune_usage(before).await {
            Ok(pruned) if pruned > 0 => tracing::debug!(pruned, "pruned usage rows"),
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "pruning usage rows failed"),
        }
    }
}
