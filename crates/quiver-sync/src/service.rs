//! The sync service: list, watch, poll and reconnect (R-SYNC-1…5).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::future::try_join_all;
use quiver_proto::v1 as pb;
use rand::Rng;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

use crate::client::{Connector, RegistryClient, convert};
use crate::follow::{Follower, Plan};
use crate::report::{HealthSource, Reporter};
use crate::snapshot::{Shared, SnapshotHandle};
use crate::{SyncError, SyncOptions};

/// Follows the registry and publishes snapshots; see the crate docs.
pub struct SyncService {
    options: SyncOptions,
    connector: Arc<Connector>,
    shared: Arc<Shared>,
    health: Option<Arc<dyn HealthSource>>,
    key_uses: crate::KeyUses,
}

impl SyncService {
    /// Checks the options; nothing connects until [`Self::run`].
    pub fn new(options: SyncOptions) -> Result<Self, SyncError> {
        options.validate()?;
        Ok(SyncService {
            connector: Arc::new(Connector::new(&options)?),
            options,
            shared: Shared::new(),
            health: None,
            key_uses: crate::KeyUses::default(),
        })
    }

    /// Includes per-server health from `source` in status reports.
    pub fn with_health_source(mut self, source: Arc<dyn HealthSource>) -> Self {
        self.health = Some(source);
        self
    }

    /// Where the worker records API key uses; status reports carry them to
    /// the registry.
    pub fn key_uses(&self) -> crate::KeyUses {
        self.key_uses.clone()
    }

    /// The approvals client, on the replica the sync follows.
    pub fn approvals(&self) -> crate::approvals::RegistryApprovals {
        crate::approvals::RegistryApprovals {
            connector: self.connector.clone(),
            worker_id: self.options.worker_id.clone(),
        }
    }

    /// The registry's OAuth access tokens, asked of the replica this sync
    /// follows.
    pub fn tokens(&self) -> crate::oauth::RegistryTokens {
        crate::oauth::RegistryTokens {
            connector: self.connector.clone(),
            worker_id: self.options.worker_id.clone(),
        }
    }

    /// The registry's memory of deleted gateway sessions, asked of the
    /// replica this sync follows.
    pub fn sessions(&self) -> crate::sessions::RegistrySessions {
        crate::sessions::RegistrySessions {
            connector: self.connector.clone(),
        }
    }

    /// The registry's rate-limit windows and usage counts, asked of the
    /// replica this sync follows.
    pub fn usage(&self) -> crate::usage::RegistryUsage {
        crate::usage::RegistryUsage {
            connector: self.connector.clone(),
        }
    }

    /// A handle to read snapshots; valid before, during and after `run`.
    pub fn handle(&self) -> SnapshotHandle {
        SnapshotHandle {
            shared: self.shared.clone(),
        }
    }

    /// Follows the registry and reports status until `shutdown` is
    /// cancelled. Handles keep serving the last snapshot afterwards.
    pub async fn run(self, shutdown: CancellationToken) {
        metrics::gauge!("quiver_worker_registry_degraded").set(0.0);
        self.shared.set_registry(self.connector.current_url());
        let reporter = Reporter {
            shared: self.shared.clone(),
            connector: self.connector.clone(),
            worker_id: self.options.worker_id.clone(),
            interval: self.options.report_interval,
            health: self.health.clone(),
            key_uses: self.key_uses.clone(),
        };
        // Both loops run forever; dropping them on cancellation is the one
        // shutdown path, and no await point sits inside a publish.
        tokio::select! {
            () = shutdown.cancelled() => {}
            ((), ()) = async { tokio::join!(self.sync_forever(), reporter.run()) } => {}
        }
    }

    fn backoff(&self) -> impl Iterator<Item = Duration> + use<> {
        ExponentialBuilder::default()
            .with_min_delay(self.options.backoff_min)
            .with_max_delay(self.options.backoff_max)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// Follows a replica until it fails, then the next one (R-SYNC-8): a
    /// replica that fails is left at once for the next; only when a whole
    /// round has failed does the sync back off. The new replica's list
    /// continues from the revision already applied, and its watch resumes
    /// after it, so a failover neither skips nor repeats a revision.
    async fn sync_forever(&self) {
        let mut backoff = self.backoff();
        // Consecutive failures without an established watch.
        let mut failures = 0usize;
        // Whether the last attempt may be resumed ([`resumable`]).
        let mut resume = false;
        loop {
            let mut established = false;
            let from = self.connector.current_url().to_owned();
            let Err(err) = self.follow(&mut established, resume).await;
            resume = resumable(&err);
            if established {
                backoff = self.backoff();
                failures = 0;
            }
            failures += 1;
            self.shared.set_degraded(&err);
            self.connector.reconnect();
            let replicas = self.connector.replicas();
            if replicas > 1 {
                let to = self.connector.fail_over().to_owned();
                metrics::counter!("quiver_worker_registry_failovers_total").increment(1);
                tracing::warn!(error = %err, from = %from, to = %to, revision = self.shared.current().revision, "registry replica failed; following the next one");
                self.shared.set_registry(&to);
                if !failures.is_multiple_of(replicas) {
                    // The workers of a replica that died all notice at
                    // once: spread their arrival at the next one.
                    tokio::time::sleep(self.failover_delay()).await;
                    continue;
                }
            }
            // backon's jitter adds up to one more delay on top; the cap holds
            // for the total.
            let delay = backoff
                .next()
                .unwrap_or(self.options.backoff_max)
                .min(self.options.backoff_max);
            tracing::warn!(
                error = %err,
                retry_in_ms = delay.as_millis() as u64,
                revision = self.shared.current().revision,
                "registry sync interrupted; serving the last snapshot"
            );
            tokio::time::sleep(delay).await;
        }
    }

    fn failover_delay(&self) -> Duration {
        let spread = self.options.failover_spread;
        if spread.is_zero() {
            return spread;
        }
        rand::rng().random_range(Duration::ZERO..=spread)
    }

    fn next_poll(&self) -> Instant {
        let (min, max) = self.options.poll_interval;
        Instant::now() + rand::rng().random_range(min..=max)
    }

    /// One connection: open the watch ([`Self::open`]), apply events until
    /// something fails. Sets `established` once the watch is open.
    async fn follow(&self, established: &mut bool, resume: bool) -> Result<Infallible, SyncError> {
        let client = self.connector.client();
        let (mut follower, mut stream) = self.open(&client, resume).await?;
        *established = true;
        self.shared.clear_degraded();

        let idle = self.options.stream_idle_timeout;
        let mut last_message = Instant::now();
        let mut poll_at = self.next_poll();
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = sleep_until(last_message + idle) => return Err(SyncError::StreamIdle(idle)),
                () = sleep_until(poll_at) => {
                    poll_at = self.next_poll();
                    // The poll is a safety net next to a live stream: its
                    // failure is worth a warning, not a reconnect.
                    match client.list().await {
                        Ok(listed) => follower.offer(listed),
                        Err(err) => tracing::warn!(error = %err, "registry poll failed"),
                    }
                    continue;
                }
            };
            last_message = Instant::now();
            let event = message
                .map_err(|status| SyncError::rpc("watch", &status))?
                .ok_or(SyncError::StreamEnded)?;
            let Plan::Fetch(ids) = follower.plan(&event)? else {
                continue;
            };
            let fetched = fetch(&client, &event, ids).await?;
            follower.apply_access(&event)?;
            follower.apply(&event, fetched);
            if follower.is_stuck() {
                tracing::info!(
                    applied = follower.applied(),
                    "records keep moving ahead of the watch; listing instead"
                );
                follower.offer(client.list().await?);
            }
            follower.publish_if_consistent();
        }
    }

    /// Resumes watching from the published revision when `resume` (the
    /// last attempt lost its connection, not its consistency) and a
    /// snapshot is held: the registry replays what was missed, so a
    /// reconnect or a failover costs one watch, not a full list (a
    /// replica's death moves its workers without relisting them all).
    /// Otherwise, or when the registry cannot resume from there (compacted
    /// past it, or behind it: a database restored from a backup), lists and
    /// watches from the list's revision.
    async fn open(
        &self,
        client: &RegistryClient,
        resume: bool,
    ) -> Result<(Follower, Streaming<pb::WatchMcpServersResponse>), SyncError> {
        if resume && self.shared.is_ready() {
            let follower = Follower::resume(self.shared.clone());
            match client.watch(follower.applied()).await {
                Ok(stream) => return Ok((follower, stream)),
                Err(err) if err.code() == Some(tonic::Code::FailedPrecondition) => {
                    tracing::info!(error = %err, "cannot resume the watch; listing instead");
                }
                Err(err) => return Err(err),
            }
        }
        let follower = Follower::from_list(self.shared.clone(), client.list().await?);
        let stream = client.watch(follower.applied()).await?;
        Ok((follower, stream))
    }
}

/// Whether the next attempt may resume the watch where the last one was
/// instead of listing everything again: yes unless the registry's answers
/// themselves broke the follower's trust (a gap in the revisions, a record
/// it cannot read, a watch refused from that revision). A lost connection
/// shows as many codes (`UNAVAILABLE`, `INTERNAL` for a reset stream,
/// `UNKNOWN`, a timeout, a stream that ended or went silent), so it is
/// told by what it is not.
fn resumable(err: &SyncError) -> bool {
    !matches!(
        err,
        SyncError::RevisionGap { .. }
            | SyncError::Conversion { .. }
            | SyncError::Rpc {
                code: tonic::Code::FailedPrecondition,
                ..
            }
    )
}

/// The records an event needs: those it carries (as of its revision), the
/// rest (an older registry, a replay beyond its cache) with `GetMcpServer`.
async fn fetch(
    client: &RegistryClient,
    event: &pb::WatchMcpServersResponse,
    ids: Vec<String>,
) -> Result<Vec<(String, Option<quiver_model::StoredServer>)>, SyncError> {
    let mut records = Vec::with_capacity(ids.len());
    let mut missing = Vec::new();
    for id in ids {
        let carried = event.servers.iter().find(|server| {
            server.revision == event.revision
                && server
                    .spec
                    .as_ref()
                    .is_some_and(|spec| spec.server_id == id)
        });
        match carried {
            Some(server) => records.push((id, Some(convert(server.clone())?))),
            None => missing.push(id),
        }
    }
    if !missing.is_empty() {
        metrics::counter!("quiver_worker_registry_fetches_total").increment(missing.len() as u64);
    }
    records.extend(
        try_join_all(missing.into_iter().map(|id| async move {
            let server = client.get(id.clone()).await?;
            Ok::<_, SyncError>((id, server))
        }))
        .await?,
    );
    Ok(records)
}
