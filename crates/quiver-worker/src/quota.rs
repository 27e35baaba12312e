//! A policy's `rate_limits` and `max_concurrent_calls` on this worker
//! (docs/reference.md §12.3).
//!
//! Rate limits count across the fleet: each counter's window lives at the
//! registry, which leases it out in shares ([`lease_share`] calls per
//! lease). A call takes one call of the share this worker holds (no
//! registry round trip while it holds some); a worker whose share ran out
//! asks for the next one; one that stops using its share gives it back
//! after [`IDLE_RETURN`]. The registry never grants more than the limit per
//! window, so the fleet never runs more calls than the limit while the
//! registry answers; the error is the other way (a call refused while
//! another worker holds unused calls) and at most `(workers − 1) × share`
//! until those are given back.
//!
//! Cut off from the registry (a lease not answered within
//! [`LEASE_TIMEOUT`]), a worker keeps enforcing its local share of each
//! limit, `ceil(calls / live workers)` per window of its own, the live
//! workers as the registry last said, and asks the registry again after
//! [`OFFLINE_RETRY`]. Calls counted only locally are not added to the
//! registry's window afterwards: during an outage the fleet runs at most
//! the limit plus one call per worker (rounding) per window.
//!
//! `max_concurrent_calls` is local: each worker lets a caller have that
//! many calls running at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use quiver_model::rate_limit::{CompiledRateLimit, LimitKey};
use quiver_sync::RegistryUsage;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How long a call waits for the registry to lease it a share.
pub const LEASE_TIMEOUT: Duration = Duration::from_millis(500);
/// After a lease failed, how long the worker enforces local shares before
/// asking the registry again.
pub const OFFLINE_RETRY: Duration = Duration::from_secs(2);
/// A share unused this long goes back to the registry.
pub const IDLE_RETURN: Duration = Duration::from_secs(1);
/// The longest a refusal for `max_concurrent_calls` tells the caller to wait.
const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);
/// Counters and concurrency entries one worker keeps at most; beyond,
/// idle ones are dropped first, then new callers are refused.
const MAX_ENTRIES: usize = 100_000;

/// Calls one lease asks for: 1 for small limits (exact across the fleet),
/// a twentieth of the limit for large ones (one registry round trip per
/// that many calls), at most 1000.
pub fn lease_share(calls: u32) -> u32 {
    (calls / 20).clamp(1, 1000)
}

/// Why a call may not run now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Which rule refused, for the caller and the audit line.
    pub message: String,
    /// When trying again may succeed.
    pub retry_after: Duration,
}

/// What a call that may run holds until it ends.
pub struct Admission {
    _running: Option<OwnedSemaphorePermit>,
}

impl Admission {
    /// A call no limit applies to.
    pub fn unlimited() -> Self {
        Admission { _running: None }
    }
}

/// Where a call's count came from, to undo it when a later limit refuses.
#[derive(Debug, Clone, Copy)]
enum Taken {
    /// From the share leased from the registry.
    Leased,
    /// From this worker's local window.
    Local,
}

/// The state of one counter on this worker.
#[derive(Default)]
struct Counter {
    /// Calls of the registry's window this worker holds and did not use.
    held: u32,
    /// The registry's window they belong to.
    window_id: i64,
    /// When that window ends (local clock).
    window_end: Option<Instant>,
    /// The registry said the window is used up until then.
    exhausted_until: Option<Instant>,
    /// The registry did not answer: local shares until then.
    offline_until: Option<Instant>,
    /// The local window while offline: its end and calls used.
    local: Option<(Instant, u32)>,
    /// Live workers as the registry last said.
    live_workers: u32,
    last_used: Option<Instant>,
}

/// Rate limits and concurrency caps of this worker's callers.
pub struct Quotas {
    registry: Option<RegistryUsage>,
    counters: StdMutex<HashMap<LimitKey, Arc<Mutex<Counter>>>>,
    running: StdMutex<HashMap<(String, String), Arc<Semaphore>>>,
}

impl Default for Quotas {
    /// Quotas counted on this worker alone (no registry: tests, tools).
    fn default() -> Self {
        Quotas::new(None)
    }
}

impl Quotas {
    /// Quotas counted with `registry` (fleet-wide), or locally without one.
    pub fn new(registry: Option<RegistryUsage>) -> Self {
        Quotas {
            registry,
            counters: StdMutex::default(),
            running: StdMutex::default(),
        }
    }

    /// Admits a call of `tool` at `server_id` by `principal` under policy
    /// `policy` with its `limits` and `max_concurrent`, or says which rule
    /// refuses it.
    pub async fn admit(
        &self,
        policy: &str,
        principal: &str,
        limits: &[CompiledRateLimit],
        max_concurrent: Option<u32>,
        (server_id, tool): (&str, &str),
    ) -> Result<Admission, Refusal> {
        let running = match max_concurrent {
            Some(max) => Some(self.start_running(policy, principal, max)?),
            None => None,
        };
        let mut taken: Vec<(Arc<Mutex<Counter>>, Taken)> = Vec::new();
        for limit in limits.iter().filter(|l| l.applies(server_id, tool)) {
            let key = limit.key(policy, principal);
            let counter = self.counter(key.clone())?;
            let outcome = self.take(&counter, &key.0, limit).await;
            match outcome {
                Ok(how) => taken.push((counter, how)),
                Err(retry_after) => {
                    // What the earlier limits gave this call stays with
                    // this worker for the next one.
                    for (counter, how) in taken {
                        let mut state = counter.lock().await;
                        match (how, state.local.as_mut()) {
                            (Taken::Local, Some((_, used))) => *used = used.saturating_sub(1),
                            (Taken::Local, None) => {}
                            (Taken::Leased, _) => state.held += 1,
                        }
                    }
                    return Err(Refusal {
                        message: format!(
                            "{limit} reached; the window ends in {} ms",
                            retry_after.as_millis()
                        ),
                        retry_after,
                    });
                }
            }
        }
        Ok(Admission { _running: running })
    }

    fn start_running(
        &self,
        policy: &str,
        principal: &str,
        max: u32,
    ) -> Result<OwnedSemaphorePermit, Refusal> {
        let semaphore = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            let key = (policy.to_owned(), principal.to_owned());
            if !running.contains_key(&key) && running.len() >= MAX_ENTRIES {
                // Entries nobody runs a call under go first.
                running.retain(|_, semaphore| Arc::strong_count(semaphore) > 1);
            }
            running
                .entry(key)
                .or_insert_with(|| Arc::new(Semaphore::new(max as usize)))
                .clone()
        };
        semaphore.try_acquire_owned().map_err(|_| Refusal {
            message: format!(
                "max_concurrent_calls ({max}) reached: this caller already has {max} calls running on this worker"
            ),
            retry_after: CONCURRENCY_RETRY,
        })
    }

    fn counter(&self, key: LimitKey) -> Result<Arc<Mutex<Counter>>, Refusal> {
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        if !counters.contains_key(&key) && counters.len() >= MAX_ENTRIES {
            return Err(Refusal {
                message: format!("this worker tracks {MAX_ENTRIES} rate-limit counters already"),
                retry_after: IDLE_RETURN,
            });
        }
        Ok(counters.entry(key.clone()).or_default().clone())
    }

    /// Takes one call of `limit`'s counter, leasing a share when this
    /// worker holds none; `Err` carries when to try again.
    async fn take(
        &self,
        counter: &Arc<Mutex<Counter>>,
        key: &str,
        limit: &CompiledRateLimit,
    ) -> Result<Taken, Duration> {
        let mut state = counter.lock().await;
        let now = Instant::now();
        state.last_used = Some(now);
        if state.held > 0 && state.window_end.is_some_and(|end| now < end) {
            state.held -= 1;
            return Ok(Taken::Leased);
        }
        if let Some(until) = state.exhausted_until.filter(|until| now < *until) {
            return Err(until - now);
        }
        let offline = state.offline_until.is_some_and(|until| now < until);
        match (&self.registry, offline) {
            (Some(registry), false) => match lease(registry, key, limit).await {
                Ok(lease) => {
                    let end = Instant::now() + lease.remaining;
                    state.offline_until = None;
                    state.local = None;
                    state.live_workers = lease.live_workers;
                    state.window_id = lease.window_id;
                    state.window_end = Some(end);
                    if lease.granted == 0 {
                        state.held = 0;
                        state.exhausted_until = Some(end);
                        return Err(lease.remaining);
                    }
                    state.exhausted_until = None;
                    state.held = lease.granted - 1;
                    Ok(Taken::Leased)
                }
                Err(err) => {
                    tracing::warn!(error = %err, "rate-limit lease failed; enforcing this worker's share locally");
                    metrics::counter!("quiver_worker_rate_limit_offline_total").increment(1);
                    state.offline_until = Some(now + OFFLINE_RETRY);
                    take_locally(&mut state, limit, now)
                }
            },
            _ => take_locally(&mut state, limit, now),
        }
    }

    /// Gives back shares unused for [`IDLE_RETURN`] and forgets counters
    /// whose windows ended long ago, every second until `shutdown`; then
    /// gives back every share.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut timer = tokio::time::interval(IDLE_RETURN);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = timer.tick() => {}
            }
            self.sweep(IDLE_RETURN).await;
        }
        self.sweep(Duration::ZERO).await;
    }

    async fn sweep(&self, idle: Duration) {
        let counters: Vec<(LimitKey, Arc<Mutex<Counter>>)> = {
            let counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
            counters
                .iter()
                .map(|(k, c)| (k.clone(), c.clone()))
                .collect()
        };
        let now = Instant::now();
        let mut forget = Vec::new();
        for (key, counter) in counters {
            let mut state = counter.lock().await;
            let idle_for = state.last_used.map_or(Duration::MAX, |at| now - at);
            if state.held > 0 && idle_for >= idle {
                let live = state.window_end.is_some_and(|end| now < end);
                if let (true, Some(registry)) = (live, &self.registry) {
                    let given = state.held;
                    if let Err(err) = registry
                        .give_back(&key.0, state.window_id, given, LEASE_TIMEOUT)
                        .await
                    {
                        tracing::debug!(error = %err, "giving back rate-limit calls failed");
                    }
                }
                state.held = 0;
            }
            let ended = [
                state.window_end,
                state.exhausted_until,
                state.local.map(|l| l.0),
            ]
            .into_iter()
            .flatten()
            .all(|end| end + Duration::from_secs(60) < now);
            if state.held == 0 && ended && idle_for > Duration::from_secs(60) {
                forget.push(key);
            }
        }
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        for key in forget {
            // Only when nobody took it up again meanwhile.
            if counters
                .get(&key)
                .is_some_and(|c| Arc::strong_count(c) == 1)
            {
                counters.remove(&key);
            }
        }
    }
}

/// Leases a share of `limit`'s window, within [`LEASE_TIMEOUT`] in all:
/// once more at once when the first attempt failed fast (a registry that
/// restarted: the first request finds the old connection closed).
async fn lease(
    registry: &RegistryUsage,
    key: &str,
    limit: &CompiledRateLimit,
) -> Result<quiver_sync::LeasedCalls, quiver_sync::SyncError> {
    let deadline = Instant::now() + LEASE_TIMEOUT;
    let ask = lease_share(limit.limit.calls);
    let (calls, per_s) = (limit.limit.calls, limit.limit.per_s);
    match registry.lease(key, calls, per_s, ask, LEASE_TIMEOUT).await {
        Err(_) if Instant::now() < deadline => {
            let left = deadline.saturating_duration_since(Instant::now());
            registry.lease(key, calls, per_s, ask, left).await
        }
        answered => answered,
    }
}

/// One call of this worker's local share of `limit` (no registry, or cut
/// off from it).
fn take_locally(
    state: &mut Counter,
    limit: &CompiledRateLimit,
    now: Instant,
) -> Result<Taken, Duration> {
    let share = limit.limit.calls.div_ceil(state.live_workers.max(1));
    let (end, used) = match state.local {
        Some((end, used)) if now < end => (end, used),
        _ => (now + Duration::from_secs(u64::from(limit.limit.per_s)), 0),
    };
    if used >= share {
        state.local = Some((end, used));
        return Err(end - now);
    }
    state.local = Some((end, used + 1));
    Ok(Taken::Local)
}

#[cfg(test)]
mod tests {
    use quiver_model::rate_limit::{LimitScope, RateLimit, compile_rate_limits};

    use super::*;

    fn limits(rules: &[(&str, u32, u32, LimitScope)]) -> Vec<CompiledRateLimit> {
        let rules: Vec<RateLimit> = rules
            .iter()
            .map(|(tools, calls, per_s, per)| RateLimit {
                tools: (*tools).into(),
                calls: *calls,
                per_s: *per_s,
                per: *per,
            })
            .collect();
        compile_rate_limits(&rules).unwrap()
    }

    #[test]
    fn shares_grow_with_the_limit() {
        assert_eq!(lease_share(1), 1);
        assert_eq!(lease_share(10), 1);
        assert_eq!(lease_share(200), 10);
        assert_eq!(lease_share(u32::MAX), 1000);
    }

    #[tokio::test]
    async fn local_windows_count_per_principal_or_policy_and_reopen() {
        let quotas = Quotas::default();
        let per_principal = limits(&[("s.echo", 2, 1, LimitScope::Principal)]);
        let admit = |principal: &'static str, tool: &'static str| {
            let (quotas, limits) = (&quotas, &per_principal);
            async move {
                quotas
                    .admit("p", principal, limits, None, ("s", tool))
                    .await
            }
        };
        assert!(admit("alice", "echo").await.is_ok());
        assert!(admit("alice", "echo").await.is_ok());
        let refusal = admit("alice", "echo").await.err().unwrap();
        assert!(
            refusal.message.contains("rate_limits[0]"),
            "{}",
            refusal.message
        );
        assert!(refusal.retry_after <= Duration::from_secs(1), "{refusal:?}");
        assert!(admit("bob", "echo").await.is_ok(), "another principal");
        assert!(admit("alice", "other").await.is_ok(), "another tool");
        tokio::time::sleep(refusal.retry_after).await;
        assert!(admit("alice", "echo").await.is_ok(), "the window reopened");

        let shared = limits(&[("s.*", 1, 10, LimitScope::Policy)]);
        assert!(
            quotas
                .admit("q", "alice", &shared, None, ("s", "a"))
                .await
                .is_ok()
        );
        assert!(
            quotas
                .admit("q", "bob", &shared, None, ("s", "b"))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_later_limit_refusing_gives_back_what_earlier_ones_took() {
        let quotas = Quotas::default();
        let both = limits(&[
            ("s.*", 5, 60, LimitScope::Principal),
            ("s.echo", 1, 60, LimitScope::Principal),
        ]);
        assert!(
            quotas
                .admit("p", "a", &both, None, ("s", "echo"))
                .await
                .is_ok()
        );
        for _ in 0..3 {
            let refusal = quotas
                .admit("p", "a", &both, None, ("s", "echo"))
                .await
                .err()
                .unwrap();
            assert!(
                refusal.message.contains("rate_limits[1]"),
                "{}",
                refusal.message
            );
        }
        // The broad limit counted one call, not four: four more fit.
        for _ in 0..4 {
            assert!(
                quotas
                    .admit("p", "a", &both, None, ("s", "add"))
                    .await
                    .is_ok()
            );
        }
        assert!(
            quotas
                .admit("p", "a", &both, None, ("s", "add"))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn concurrent_calls_are_capped_per_caller_and_freed_when_done() {
        let quotas = Quotas::default();
        let first = quotas
            .admit("p", "a", &[], Some(2), ("s", "t"))
            .await
            .unwrap();
        let _second = quotas
            .admit("p", "a", &[], Some(2), ("s", "t"))
            .await
            .unwrap();
        let refusal = quotas
            .admit("p", "a", &[], Some(2), ("s", "t"))
            .await
            .err()
            .unwrap();
        assert!(
            refusal.message.contains("max_concurrent_calls (2)"),
            "{}",
            refusal.message
        );
        assert!(
            quotas
                .admit("p", "b", &[], Some(2), ("s", "t"))
                .await
                .is_ok(),
            "another caller"
        );
        drop(first);
        assert!(
            quotas
                .admit("p", "a", &[], Some(2), ("s", "t"))
                .await
                .is_ok()
        );
    }
}
