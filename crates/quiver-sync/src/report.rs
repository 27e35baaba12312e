//! Status reports to the registry (R-SYNC-7): snapshot revision, degraded
//! flag and per-server health, so admins see what each worker serves.

use std::sync::Arc;
use std::time::Duration;

use quiver_proto::v1 as pb;
use rand::Rng;
use tokio::time::{Instant, sleep_until};

use crate::client::Connector;
use crate::snapshot::Shared;

/// Per-server health, supplied by whoever owns the MCP connections.
pub trait HealthSource: Send + Sync {
    /// Current health of every server the worker knows about.
    fn server_health(&self) -> Vec<pb::ServerHealth>;
}

impl<F> HealthSource for F
where
    F: Fn() -> Vec<pb::ServerHealth> + Send + Sync,
{
    fn server_health(&self) -> Vec<pb::ServerHealth> {
        self()
    }
}

/// A status change is reported once no further change has come for this
/// long: during a burst of registry writes every worker would otherwise
/// report every snapshot, competing with the fetches that apply them.
const SETTLE: Duration = Duration::from_millis(500);
/// The settle period is drawn from 1 to this many times [`SETTLE`].
const SETTLE_SPREAD: f64 = 4.0;

pub(crate) struct Reporter {
    pub(crate) shared: Arc<Shared>,
    /// Reports go to the replica the sync follows.
    pub(crate) connector: Arc<Connector>,
    pub(crate) worker_id: String,
    pub(crate) interval: Duration,
    pub(crate) health: Option<Arc<dyn HealthSource>>,
    pub(crate) key_uses: crate::KeyUses,
}

impl Reporter {
    /// Reports forever; the caller cancels by dropping the future.
    pub(crate) async fn run(self) {
        loop {
            // A fleet sees a change at once: its reports are spread over a
            // few settle periods rather than all landing on the registry
            // together, and on the fan-out of the next change (issue #28).
            let settle = SETTLE
                .mul_f64(rand::rng().random_range(1.0..=SETTLE_SPREAD))
                .min(self.interval);
            let periodic = Instant::now() + self.jittered_interval();
            tokio::select! {
                () = sleep_until(periodic) => {}
                () = self.shared.status_changed.notified() => loop {
                    tokio::select! {
                        () = tokio::time::sleep(settle) => break,
                        () = sleep_until(periodic) => break,
                        () = self.shared.status_changed.notified() => {}
                    }
                },
            }
            // A report of revision 0 before the first snapshot would read as
            // "empty registry"; the worker is simply not ready yet.
            if self.shared.is_ready() {
                self.report().await;
            }
        }
    }

    /// 80–100 % of the interval, so workers started together do not keep
    /// reporting together.
    fn jittered_interval(&self) -> Duration {
        self.interval.mul_f64(rand::rng().random_range(0.8..=1.0))
    }

    async fn report(&self) {
        let degraded = self.shared.is_degraded();
        let request = pb::ReportWorkerStatusRequest {
            worker_id: self.worker_id.clone(),
            snapshot_revision: self.shared.current().revision,
            degraded,
            servers: self
                .health
                .as_ref()
                .map(|health| health.server_health())
                .unwrap_or_default(),
            key_uses: self.key_uses.take(),
        };
        let key_uses = request.key_uses.clone();
        match self.connector.client().report(request).await {
            Ok(response) => tracing::trace!(head = response.head_revision, "status reported"),
            Err(err) if !key_uses.is_empty() => {
                tracing::warn!(error = %err, "status report failed; key uses kept for the next");
                self.key_uses.restore(key_uses);
            }
            // While degraded the sync loop already reports the outage.
            Err(err) if degraded => tracing::debug!(error = %err, "status report failed"),
            Err(err) => tracing::warn!(error = %err, "status report failed"),
        }
    }
}
