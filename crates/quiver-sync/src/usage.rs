//! The worker's client of the registry's rate-limit windows and usage
//! counts (docs/reference.md §12.3), asked of the replica the sync follows
//! with the worker token. Every call is bounded by the caller's timeout.

use std::sync::Arc;
use std::time::Duration;

use quiver_model::usage::{UsageCounts, UsageKey};
use quiver_proto::v1 as pb;

use crate::SyncError;
use crate::client::Connector;

/// Calls of a window the registry leased to this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasedCalls {
    /// Calls granted (0: the window is used up).
    pub granted: u32,
    /// The window, to give unused calls back to.
    pub window_id: i64,
    /// Until the window ends, from when the registry answered.
    pub remaining: Duration,
    /// Live workers the registry knows of (at least 1).
    pub live_workers: u32,
}

/// Leases rate-limit windows and reports usage; cheap to clone.
#[derive(Clone)]
pub struct RegistryUsage {
    pub(crate) connector: Arc<Connector>,
}

impl std::fmt::Debug for RegistryUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistryUsage(..)")
    }
}

impl RegistryUsage {
    /// Leases up to `want` calls of counter `key`'s window (`calls` per
    /// `per_s` seconds).
    pub async fn lease(
        &self,
        key: &str,
        calls: u32,
        per_s: u32,
        want: u32,
        timeout: Duration,
    ) -> Result<LeasedCalls, SyncError> {
        let request = pb::LeaseCallsRequest {
            key: key.to_owned(),
            calls,
            per_s,
            want,
        };
        let mut client = self.connector.usage_client();
        let response = self
            .connector
            .bounded_by("lease calls", timeout, client.lease_calls(request))
            .await?;
        Ok(LeasedCalls {
            granted: response.granted,
            window_id: response.window_id,
            remaining: Duration::from_millis(
                u64::try_from(response.window_remaining_ms).unwrap_or(0),
            ),
            live_workers: response.live_workers.max(1),
        })
    }

    /// Gives back `calls` of window `window_id` of counter `key`.
    pub async fn give_back(
        &self,
        key: &str,
        window_id: i64,
        calls: u32,
        timeout: Duration,
    ) -> Result<(), SyncError> {
        let request = pb::ReturnCallsRequest {
            key: key.to_owned(),
            window_id,
            calls,
        };
        let mut client = self.connector.usage_client();
        self.connector
            .bounded_by("return calls", timeout, client.return_calls(request))
            .await?;
        Ok(())
    }

    /// Reports a batch of usage counts, numbered `batch_id` at `source`.
    pub async fn report(
        &self,
        source: &str,
        batch_id: u64,
        rows: &[(UsageKey, UsageCounts)],
        timeout: Duration,
    ) -> Result<(), SyncError> {
        let request = pb::ReportUsageRequest {
            source: source.to_owned(),
            batch_id,
            rows: rows
                .iter()
                .map(|(key, counts)| pb::UsageRow {
                    principal: key.principal.clone(),
                    policy: key.policy.clone(),
                    server_id: key.server_id.clone(),
                    tool: key.tool.clone(),
                    minute_ms: key.minute_ms,
                    calls: counts.calls,
                    errors: counts.errors,
                    rate_limited: counts.rate_limited,
                    latency_buckets: counts.latency.to_vec(),
                })
                .collect(),
        };
        let mut client = self.connector.usage_client();
        self.connector
            .bounded_by("report usage", timeout, client.report_usage(request))
            .await?;
        Ok(())
    }
}
