//! Usage counts of this worker's tool calls, reported to the registry
//! (docs/reference.md §12.3): per (principal, policy, server, tool, minute)
//! the calls, errors, rate-limit refusals and a latency histogram, added up
//! in memory and sent in batches every flush interval.
//!
//! Bounded both ways: at most [`MAX_PENDING_KEYS`] keys wait to be sent
//! (calls of further keys are dropped and counted in
//! `quiver_worker_usage_dropped_total`), and at most [`MAX_UNSENT_BATCHES`]
//! batches wait for a registry that does not answer (the oldest go first).
//! A batch keeps its number until the registry acknowledged it, so a batch
//! sent twice (its answer lost) counts once.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use quiver_model::usage::{MAX_BATCH_ROWS, MINUTE_MS, UsageCounts, UsageKey, bucket_of};
use quiver_sync::RegistryUsage;
use tokio_util::sync::CancellationToken;

/// Keys (principal, policy, server, tool, minute) waiting to be sent at most.
pub const MAX_PENDING_KEYS: usize = 10_000;
/// Batches waiting for the registry at most.
pub const MAX_UNSENT_BATCHES: usize = 100;
/// Default flush interval.
pub const DEFAULT_FLUSH: Duration = Duration::from_secs(5);
/// How long one report waits for the registry.
const REPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// How one call ended, for its usage row.
#[derive(Debug, Clone, Copy)]
pub enum CallUsage {
    /// It ran; `failed` when it ended in an error or `isError`.
    Ran {
        /// Whether it failed.
        failed: bool,
        /// How long it took.
        latency: Duration,
    },
    /// A rate or concurrency limit refused it.
    RateLimited,
}

/// Who made a call of what.
pub struct CallSubject<'a> {
    /// The caller's principal.
    pub principal: &'a str,
    /// The caller's policy.
    pub policy: &'a str,
    /// The server.
    pub server_id: &'a str,
    /// The tool's own name.
    pub tool: &'a str,
}

#[derive(Default)]
struct Pending {
    counts: HashMap<UsageKey, UsageCounts>,
    unsent: VecDeque<(u64, Vec<(UsageKey, UsageCounts)>)>,
    next_batch: u64,
}

/// This worker's usage counts and their reporter.
pub struct UsageRecorder {
    registry: RegistryUsage,
    /// This worker process: batch numbers are its own.
    source: String,
    pending: Mutex<Pending>,
}

impl UsageRecorder {
    /// A recorder reporting to `registry` as worker `worker_id` (a random
    /// suffix makes each process its own source).
    pub fn new(registry: RegistryUsage, worker_id: &str) -> Self {
        UsageRecorder {
            registry,
            source: format!("{worker_id}#{:016x}", rand::random::<u64>()),
            pending: Mutex::default(),
        }
    }

    /// Counts one call.
    pub fn record(&self, subject: CallSubject<'_>, usage: CallUsage) {
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let key = UsageKey {
            principal: subject.principal.to_owned(),
            policy: subject.policy.to_owned(),
            server_id: subject.server_id.to_owned(),
            tool: subject.tool.to_owned(),
            minute_ms: now_ms - now_ms.rem_euclid(MINUTE_MS),
        };
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if !pending.counts.contains_key(&key) && pending.counts.len() >= MAX_PENDING_KEYS {
            metrics::counter!("quiver_worker_usage_dropped_total").increment(1);
            return;
        }
        let counts = pending.counts.entry(key).or_default();
        match usage {
            CallUsage::Ran { failed, latency } => {
                counts.calls += 1;
                counts.errors += u64::from(failed);
                counts.latency[bucket_of(latency.as_secs_f64() * 1000.0)] += 1;
            }
            CallUsage::RateLimited => counts.rate_limited += 1,
        }
    }

    /// Moves the counts into numbered batches and sends every unsent batch,
    /// oldest first, until one fails.
    pub async fn flush(&self) {
        let batches: Vec<(u64, Vec<(UsageKey, UsageCounts)>)> = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let rows: Vec<_> = pending.counts.drain().collect();
            for chunk in rows.chunks(MAX_BATCH_ROWS) {
                let id = pending.next_batch;
                pending.next_batch += 1;
                pending.unsent.push_back((id, chunk.to_vec()));
            }
            while pending.unsent.len() > MAX_UNSENT_BATCHES {
                if let Some((_, dropped)) = pending.unsent.pop_front() {
                    metrics::counter!("quiver_worker_usage_dropped_total")
                        .increment(dropped.len() as u64);
                }
            }
            pending.unsent.iter().cloned().collect()
        };
        for (id, rows) in batches {
            match self
                .registry
                .report(&self.source, id, &rows, REPORT_TIMEOUT)
                .await
            {
                Ok(()) => {
                    let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                    pending.unsent.retain(|(unsent, _)| *unsent != id);
                }
                Err(err) => {
                    tracing::debug!(error = %err, "usage report failed; kept for the next flush");
                    return;
                }
            }
        }
    }

    /// Flushes every `every` until `shutdown`, then once more.
    pub async fn run(self: std::sync::Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let mut timer = tokio::time::interval(every);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = timer.tick() => {}
            }
            self.flush().await;
        }
        self.flush().await;
    }
}
